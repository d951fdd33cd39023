"""Django settings: every value comes from the environment through faultline.env.

With no DATABASE_URL / REDIS_URL the CLI (`faultline up`) and the test plugin start embedded
Postgres and Valkey and export those URLs before Django loads, so this module only reads.
"""

from __future__ import annotations

import json
import secrets
import sys
import tomllib
from pathlib import Path
from typing import Any, cast

from agents.wire import MAX_BATCH_BYTES
from faultline.env import (
    ConfigError,
    database_from_url,
    env_bool,
    env_int,
    env_list,
    env_networks,
    env_secret,
    env_str,
)
from faultline.sso_config import ROLES, parse_role_map

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("FAULTLINE_DATA_DIR", str(Path.cwd() / ".faultline"))).resolve()

DEBUG = env_bool("FAULTLINE_DEBUG", False)
if DEBUG:
    print("WARNING: FAULTLINE_DEBUG is on: never run like this in production", file=sys.stderr)


def _secret_key() -> str:
    key = env_secret("FAULTLINE_SECRET_KEY")
    if key:
        return key
    # A single-machine install keeps a generated key beside its data, so sessions survive
    # restarts without anyone committing a key to git.
    path = DATA_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(50)
        path.write_text(key)
        path.chmod(0o600)
        return key


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("FAULTLINE_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("FAULTLINE_CSRF_TRUSTED_ORIGINS", [])

DATABASE_URL = env_str("DATABASE_URL")
REDIS_URL = env_str("REDIS_URL")
if not DATABASE_URL:
    raise ConfigError(
        "DATABASE_URL is not set: run through `faultline up` (embedded Postgres) or export "
        "DATABASE_URL=postgres://user@host:5432/faultline"
    )
if not REDIS_URL:
    raise ConfigError("REDIS_URL is not set: run through `faultline up` or export REDIS_URL")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "console",
    "ingest",
]

MIDDLEWARE = [
    # Outermost, so the latency it records covers every other middleware.
    "faultline.metrics.RequestMetricsMiddleware",
    # Before anything reads a body (sessions, CSRF, authentication): 413/411 on the headers.
    "faultline.middleware.BodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "faultline.middleware.SecurityHeadersMiddleware",
    # Innermost, so its 400 still gets the headers above; Postgres cannot hold NUL.
    "faultline.nul.RejectNulMiddleware",
    # A view's write refused for a full disk: 503 with Retry-After, never a 500.
    "faultline.middleware.DatabaseRefusalMiddleware",
]

ROOT_URLCONF = "faultline.urls"
WSGI_APPLICATION = "faultline.wsgi.application"
ASGI_APPLICATION = "faultline.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context.console",
            ]
        },
    }
]

_db = database_from_url(DATABASE_URL)
# The psycopg pool's options (tests/system/test_db_pool_recovery.py measures these).
DB_POOL = {
    "min_size": 1,
    "max_size": env_int("FAULTLINE_DB_POOL_MAX", 8, minimum=1),
    "timeout": 10,
    # A refill that keeps failing (Postgres down) backs off 1, 2, 4, 8, 16 s...; after a
    # 30 s outage the next try was many seconds away, and requests waiting `timeout` for a
    # connection got 503 after Postgres was back (seen in CI). Giving a refill up after
    # this long lets the next request start a fresh one at once.
    "reconnect_timeout": env_int("FAULTLINE_DB_RECONNECT_S", 5, minimum=1),
}
if env_bool("FAULTLINE_DB_POOL", True):
    # Under ASGI, CONN_MAX_AGE leaks a connection per thread; the psycopg pool does not.
    _db["OPTIONS"]["pool"] = dict(DB_POOL)  # type: ignore[index]  # OPTIONS is a dict[str, Any] the env reader built
# A connection idle across a Postgres restart is broken. With health checks Django has the
# pool check each one at checkout (psycopg_pool's check_connection: one empty round trip)
# and replace a broken one, instead of failing the request that draws it with a 503 (seen
# in CI: an ingest batch right after a restart). Without the pool, the same check runs
# before a persistent connection is reused.
_db["CONN_HEALTH_CHECKS"] = env_bool("FAULTLINE_DB_HEALTH_CHECKS", True)
# Bounded waits (docs/operations.md, "Lock waits"). A statement waits at most this long for
# a row or table lock, then fails (LockNotAvailable: ingest answers 503 with Retry-After,
# a diagnosis pass leaves its group to the next one): a pass or a request stuck while
# holding rows delays the others by this much, not for as long as it is stuck. Longer than
# any wait the service has between its own live transactions (a transition behind a 16k-rank
# pass's write, ~1-2 s).
DB_LOCK_TIMEOUT_MS = env_int("FAULTLINE_DB_LOCK_TIMEOUT_MS", 10_000, minimum=0)
# Postgres ends a transaction whose client sent nothing for this long (a frozen worker, a
# SIGSTOPped process, a client paused by the kernel), and its locks with it. The service's
# longest pause between two statements of one transaction is a pass computing its writes
# (well under a second at 16k ranks); 0 turns it off.
DB_IDLE_IN_TRANSACTION_S = env_int("FAULTLINE_DB_IDLE_IN_TRANSACTION_S", 30, minimum=0)
_db_options = cast("dict[str, str]", _db["OPTIONS"])
_db_options["options"] = " ".join(
    filter(
        None,
        [
            _db_options.get("options", ""),
            f"-c lock_timeout={DB_LOCK_TIMEOUT_MS}",
            f"-c idle_in_transaction_session_timeout={DB_IDLE_IN_TRANSACTION_S * 1000}",
        ],
    )
)
_db["CONN_MAX_AGE"] = 0
_db["TEST"] = {"NAME": env_str("FAULTLINE_TEST_DB_NAME") or None}
DATABASES = {"default": _db}
# The schema owner, for `migrate --database owner` and `db_roles` when the service itself
# runs as the restricted role (faultline.dbroles, docs/security.md).
MIGRATE_DATABASE_URL = env_str("FAULTLINE_MIGRATE_DATABASE_URL")
if MIGRATE_DATABASE_URL:
    DATABASES["owner"] = {
        **database_from_url(MIGRATE_DATABASE_URL),
        "CONN_MAX_AGE": 0,
        "TEST": {"MIRROR": "default"},
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "faultline",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 300}
# Backstop, not a fix: a pool process whose peak RSS passes this is replaced after its
# current task (acks_late, so nothing is lost). A process with small groups peaks near
# 150 MB RSS; one that keeps a 16k-rank group's live diagnosis state ~550 MB, and up to
# console.snapshots.MAX_LIVE_RANKS ranks of it ~1 GB. Below that the process holding a big
# group was replaced after every pass, so every pass was a full read (7-16 s at 16k ranks:
# bench/detect.py --ranks 16384). See docs/reliability.md (soak) for why there is no
# task-count recycling.
CELERY_WORKER_MAX_MEMORY_PER_CHILD = (
    env_int("FAULTLINE_WORKER_MAX_MEMORY_MB", 2048, minimum=64) * 1024
)
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
# Every beat holds out for a leader lock in Valkey (faultline.beat): run one per service
# instance, and when the leader dies another sends the sweeps within about this TTL.
CELERY_BEAT_SCHEDULER = "faultline.beat:LeaderScheduler"
BEAT_LOCK_TTL_S = env_int("FAULTLINE_BEAT_LOCK_TTL_S", 6, minimum=2)

# Applied to every password a person sets: `faultline user create`, the admin's forms, and
# FAULTLINE_ADMIN_PASSWORD when `faultline up` creates the first admin.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Django's default (2.5 MB) answered 400 to agent batches the contract allows (up to 8 MiB),
# and the agent dead-lettered them: one limit, the contract's, for every request body.
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_BATCH_BYTES
LOGIN_URL = "/login/"
# Failed password checks per (username, client IP) before 429, and how long that lasts.
LOGIN_FAILURE_LIMIT = env_int("FAULTLINE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
LOGIN_LOCKOUT_S = env_int("FAULTLINE_LOGIN_LOCKOUT_S", 300, minimum=1)
LOGIN_REDIRECT_URL = "/"
# Notification channels may POST to loopback/private/link-local addresses only when set
# (a receiver inside the cluster): a channel URL must not reach the service's own network.
NOTIFY_ALLOW_PRIVATE = env_bool("FAULTLINE_NOTIFY_ALLOW_PRIVATE", False)
LOGOUT_REDIRECT_URL = "/login/"

# Single sign-on (OpenID Connect, faultline.sso); off unless FAULTLINE_OIDC_CLIENT_ID is set.
# Local accounts keep working beside it: they are the break-glass way in.
OIDC_ENABLED = bool(env_str("FAULTLINE_OIDC_CLIENT_ID"))
OIDC_ISSUER = env_str("FAULTLINE_OIDC_ISSUER")
OIDC_GROUPS_CLAIM = env_str("FAULTLINE_OIDC_GROUPS_CLAIM", "groups")
OIDC_USERNAME_CLAIM = env_str("FAULTLINE_OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_DEFAULT_ROLE = env_str("FAULTLINE_OIDC_DEFAULT_ROLE")
OIDC_PROVIDER_NAME = env_str("FAULTLINE_OIDC_PROVIDER_NAME", "single sign-on")
try:
    OIDC_ROLE_MAP = parse_role_map(env_list("FAULTLINE_OIDC_ROLE_MAP", []))
except ValueError as exc:
    raise ConfigError(str(exc)) from None
if OIDC_DEFAULT_ROLE and OIDC_DEFAULT_ROLE not in ROLES:
    raise ConfigError(
        f"FAULTLINE_OIDC_DEFAULT_ROLE must be viewer, operator, approver or admin "
        f"(or unset to refuse unmapped users), got {OIDC_DEFAULT_ROLE!r}"
    )
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
if OIDC_ENABLED:
    _oidc_missing = [
        name
        for name in (
            "FAULTLINE_OIDC_CLIENT_SECRET",
            # The ID token's `iss` must equal it: without it no token can be checked.
            "FAULTLINE_OIDC_ISSUER",
            "FAULTLINE_OIDC_AUTHORIZATION_ENDPOINT",
            "FAULTLINE_OIDC_TOKEN_ENDPOINT",
            "FAULTLINE_OIDC_USERINFO_ENDPOINT",
            "FAULTLINE_OIDC_JWKS_URI",
        )
        if not (env_secret(name) if name.endswith("SECRET") else env_str(name))
    ]
    if _oidc_missing:
        raise ConfigError(
            f"FAULTLINE_OIDC_CLIENT_ID is set, so single sign-on is on, but "
            f"{', '.join(_oidc_missing)} is not: see docs/operations.md (single sign-on)"
        )
    if not OIDC_ROLE_MAP and not OIDC_DEFAULT_ROLE:
        raise ConfigError(
            "single sign-on is on but FAULTLINE_OIDC_ROLE_MAP is empty: map IdP groups to "
            "roles (e.g. sre=operator,sre-leads=approver) or set FAULTLINE_OIDC_DEFAULT_ROLE"
        )
    AUTHENTICATION_BACKENDS.insert(0, "faultline.sso.FaultlineOIDCBackend")
    OIDC_RP_CLIENT_ID = env_str("FAULTLINE_OIDC_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = env_secret("FAULTLINE_OIDC_CLIENT_SECRET")
    OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("FAULTLINE_OIDC_AUTHORIZATION_ENDPOINT")
    OIDC_OP_TOKEN_ENDPOINT = env_str("FAULTLINE_OIDC_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = env_str("FAULTLINE_OIDC_USERINFO_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = env_str("FAULTLINE_OIDC_JWKS_URI")
    OIDC_RP_SIGN_ALGO = env_str("FAULTLINE_OIDC_SIGN_ALGO", "RS256")
    OIDC_RP_SCOPES = env_str("FAULTLINE_OIDC_SCOPES", "openid email profile")
    OIDC_USE_PKCE = env_bool("FAULTLINE_OIDC_USE_PKCE", True)
    OIDC_TIMEOUT = 10
    LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=refused"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = env_str("FAULTLINE_STATIC_ROOT") or None  # whitenoise serves from finders
STATICFILES_DIRS = [BASE_DIR / "static"]
WHITENOISE_USE_FINDERS = True

SECURE = env_bool("FAULTLINE_SECURE_COOKIES", False)
SESSION_COOKIE_SECURE = SECURE
CSRF_COOKIE_SECURE = SECURE
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first so an anonymous caller gets 401 + WWW-Authenticate, not 403. Tokens
        # are stored as SHA-256 only (console.tokens); DRF's authtoken kept them in clear.
        "console.api.auth.HashedTokenAuthentication",
        # Basic shares the login form's failure counter (faultline.login).
        "faultline.login.ThrottledBasicAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.api.permissions.IsViewer"],
    # DRF's parsers, refusing NUL (400) before it reaches a jsonb or text column.
    "DEFAULT_PARSER_CLASSES": [
        "faultline.nul.JSONParser",
        "faultline.nul.FormParser",
        "faultline.nul.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # At most 1,000 rows a page (`?limit=1000000` was served whole).
    "DEFAULT_PAGINATION_CLASS": "console.api.pagination.Pagination",
    "PAGE_SIZE": 200,
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Faultline API",
    "DESCRIPTION": "Incident console for GPU training and LLM-serving fleets.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/schema/ and /api/docs/ map every operation: viewers and up only, like the API.
    "SERVE_PERMISSIONS": ["console.api.permissions.IsViewer"],
    "COMPONENT_SPLIT_REQUEST": True,
    # Group and GroupDetail share these choice sets: name them once.
    "ENUM_NAME_OVERRIDES": {
        "GroupKindEnum": "console.choices.GroupKind",
        "GroupStateEnum": "console.choices.GroupState",
    },
    "SWAGGER_UI_DIST": "SIDECAR",  # served locally: the console works with no internet
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Plain Django views (POST /api/v1/ingest) documented from the wire contract itself.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "faultline.openapi.add_ingest",
        "faultline.openapi.add_alertmanager",
    ],
}

# Web serving: HTTP and websockets may sit on different ports (see README).
FAULTLINE_WS_PORT = env_int("FAULTLINE_WS_PORT", 0, minimum=0)
# Reverse proxies whose X-Forwarded-For (and, to gunicorn, X-Forwarded-Proto) are believed;
# none by default: a client sets those headers freely (faultline.client).
TRUSTED_PROXIES = env_networks("FAULTLINE_TRUSTED_PROXIES")
WS_MAX_PER_USER = env_int("FAULTLINE_WS_MAX_PER_USER", 20, minimum=1)  # open sockets a user

# /metrics (faultline.scrape): a Bearer token, or client addresses allowed without one.
METRICS_TOKEN = env_secret("FAULTLINE_METRICS_TOKEN")
METRICS_ALLOW_CIDRS = env_networks("FAULTLINE_METRICS_ALLOW_CIDRS")
METRICS_MAX_GROUPS = env_int("FAULTLINE_METRICS_MAX_GROUPS", 500, minimum=1)

# POST /api/v1/alertmanager (faultline.alertmanager): the Bearer token Alertmanager sends.
ALERTMANAGER_TOKEN = env_secret("FAULTLINE_ALERTMANAGER_TOKEN")

# Ingest limits and diagnosis cadence.
INGEST_RATE_PER_MIN = env_int("FAULTLINE_INGEST_RATE_PER_MIN", 600, minimum=1)
INGEST_MAX_FUTURE_S = env_int("FAULTLINE_INGEST_MAX_FUTURE_S", 300, minimum=1)
# What one node's token may add (docs/security.md): records a minute, GPUs in all, new
# groups an hour, how far one transition may move a generation, and how long a GPU must
# go unreported by its node before another node may claim it.
INGEST_RECORDS_PER_MIN = env_int("FAULTLINE_INGEST_RECORDS_PER_MIN", 60_000, minimum=1)
INGEST_MAX_GPUS_PER_NODE = env_int("FAULTLINE_INGEST_MAX_GPUS_PER_NODE", 16, minimum=1)
INGEST_NEW_GROUPS_PER_HOUR = env_int("FAULTLINE_INGEST_NEW_GROUPS_PER_HOUR", 20, minimum=1)
INGEST_MAX_GENERATION_JUMP = env_int("FAULTLINE_INGEST_MAX_GENERATION_JUMP", 1000, minimum=1)
INGEST_DEVICE_MOVE_AFTER_S = env_int("FAULTLINE_INGEST_DEVICE_MOVE_AFTER_S", 900, minimum=0)
# Who owns a group (ingest.ownership): how far its generation may move in an hour, and how
# long after its first rank is placed new nodes may still join its first rendezvous.
INGEST_GENERATION_ADVANCE_PER_HOUR = env_int(
    "FAULTLINE_INGEST_GENERATION_ADVANCE_PER_HOUR", 1000, minimum=1
)
INGEST_RENDEZVOUS_S = env_int("FAULTLINE_INGEST_RENDEZVOUS_S", 300, minimum=0)
# Group commit (ingest.store.group_commit): batches that arrive at one web process while it
# writes another share the next transaction, up to this many; 1 gives each its own.
INGEST_GROUP_COMMIT_MAX = env_int("FAULTLINE_INGEST_GROUP_COMMIT_MAX", 16, minimum=1)
TELEMETRY_RETENTION_DAYS = env_int("FAULTLINE_RETENTION_DAYS", 14, minimum=1)
# Retention of what is not raw partitioned telemetry (ingest.retention, hourly). Receipts
# are only the idempotency key of recent batches: past this the agent's high-water mark
# and gap list answer for them. Rollups and event rows are never kept shorter than raw.
RECEIPT_RETENTION_HOURS = env_int("FAULTLINE_RECEIPT_RETENTION_HOURS", 24, minimum=1)
ROLLUP_RETENTION_DAYS = env_int("FAULTLINE_ROLLUP_RETENTION_DAYS", 90, minimum=1)
EVENT_RETENTION_DAYS = env_int("FAULTLINE_EVENT_RETENTION_DAYS", 90, minimum=1)
DIAGNOSIS_DEBOUNCE_MS = env_int("FAULTLINE_DIAGNOSIS_DEBOUNCE_MS", 200, minimum=0)
# Groups younger than DIAGNOSIS_YOUNG_GROUP_S wait behind established ones: at most
# DIAGNOSIS_YOUNG_PER_S of their diagnoses are queued a second per node that created them
# (the next batch or the sweep catches up on the rest; the sweep's own runs of them have
# a budget of half that, so idle young groups never starve a new job's batches), so one
# token's invented groups cannot delay a real job's incident, nor spend a real new job's
# budget. Their debounce is
# the ordinary one unless DIAGNOSIS_YOUNG_DEBOUNCE_MS says more: jobs often fail in their
# first minutes, and a new job's Xid must page as fast as an old one's.
DIAGNOSIS_YOUNG_GROUP_S = env_int("FAULTLINE_DIAGNOSIS_YOUNG_GROUP_S", 600, minimum=0)
DIAGNOSIS_YOUNG_DEBOUNCE_MS = env_int("FAULTLINE_DIAGNOSIS_YOUNG_DEBOUNCE_MS", 0, minimum=0)
DIAGNOSIS_YOUNG_PER_S = env_int("FAULTLINE_DIAGNOSIS_YOUNG_PER_S", 10, minimum=1)
# The urgent lane (console.scheduling): an established group's device event is also
# diagnosed at once on a queue only its own worker drains (`faultline up` runs it; so must
# any other deployment, docker-compose's worker-urgent), at most DIAGNOSIS_URGENT_PER_S
# a second per reporting node. Off: device events wait in the ordinary worker's queue.
DIAGNOSIS_URGENT_LANE = env_bool("FAULTLINE_DIAGNOSIS_URGENT_LANE", True)
DIAGNOSIS_URGENT_PER_S = env_int("FAULTLINE_DIAGNOSIS_URGENT_PER_S", 10, minimum=1)
# A pass queued for the moment a silent rank crosses its hang threshold
# (console.scheduling.schedule_check). Off: silence is judged at the sweep's ticks only.
DIAGNOSIS_CHECKS = env_bool("FAULTLINE_DIAGNOSIS_CHECKS", True)
# Fleet health (console.policy.fleet_health): after repair evidence (a new boot_id, a GPU
# reset) the hardware must run this long with no fault before it is proposed for return;
# FAULTS faults within DAYS flag it for replacement (returning it then needs an approver).
FLEET_VALIDATION_WINDOW_S = env_int("FAULTLINE_VALIDATION_WINDOW_S", 600, minimum=0)
FLEET_REPEAT_FAULTS = env_int("FAULTLINE_REPEAT_FAULTS", 3, minimum=1)
FLEET_REPEAT_WINDOW_DAYS = env_int("FAULTLINE_REPEAT_WINDOW_DAYS", 7, minimum=1)
# Operator overrides of the Xid catalog (agents/xid.py): a TOML or JSON file of
# code -> {class, action, investigatory}; read once at startup (console/apps.py).
XID_OVERRIDES_FILE = env_str("FAULTLINE_XID_OVERRIDES") or None


def _remediation_file(path: str) -> dict[str, Any]:
    """`FAULTLINE_REMEDIATION_POLICY`: a TOML or JSON file with `[gates]` (the safety gates,
    console.policy.inputs.Policy) and `[remediation]` (per-pool remediation policy,
    console.policy.remediation); both are validated where they are used, loudly."""
    if not path:
        return {}
    text = Path(path).read_text()
    data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    unknown = sorted(set(data) - {"gates", "remediation"})
    if unknown:
        raise ConfigError(
            f"{path}: unknown section(s) {', '.join(unknown)}; known: gates, remediation"
        )
    return data


_REMEDIATION = _remediation_file(env_str("FAULTLINE_REMEDIATION_POLICY"))
FAULTLINE_REMEDIATION_POLICY = _REMEDIATION.get("gates") or {}
FAULTLINE_REMEDIATION_POOLS = _REMEDIATION.get("remediation") or {}


def _objectives_file(path: str) -> dict[str, Any]:
    """`FAULTLINE_OBJECTIVES`: a TOML or JSON file of recovery objectives per pool:
    `[default]` and `[pools.<name>]` with agents.protocol.Objectives keys; validated where
    used (console.queries.objectives), loudly."""
    if not path:
        return {}
    text = Path(path).read_text()
    data: dict[str, Any] = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    return data


FAULTLINE_OBJECTIVES = _objectives_file(env_str("FAULTLINE_OBJECTIVES"))
# A dispatched action whose agent reports nothing this long fails (docs/safety.md).
FAULTLINE_ACTION_DEADLINE_S = env_int("FAULTLINE_ACTION_DEADLINE_S", 900, minimum=10)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("FAULTLINE_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
