"""Django settings: every value comes from the environment through faultline.env.

With no DATABASE_URL / REDIS_URL the CLI (`faultline up`) and the test plugin start embedded
Postgres and Valkey and export those URLs before Django loads, so this module only reads.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from faultline.env import (
    ConfigError,
    database_from_url,
    env_bool,
    env_int,
    env_list,
    env_secret,
    env_str,
)

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
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "console",
    "ingest",
]

MIDDLEWARE = [
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
if env_bool("FAULTLINE_DB_POOL", True):
    # Under ASGI, CONN_MAX_AGE leaks a connection per thread; the psycopg pool does not.
    _db["OPTIONS"]["pool"] = {  # type: ignore[index]  # OPTIONS is a dict[str, Any] the env reader built
        "min_size": 1,
        "max_size": env_int("FAULTLINE_DB_POOL_MAX", 8, minimum=1),
        "timeout": 10,
    }
_db["CONN_MAX_AGE"] = 0
_db["TEST"] = {"NAME": env_str("FAULTLINE_TEST_DB_NAME") or None}
DATABASES = {"default": _db}
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
# current task (acks_late, so nothing is lost). A healthy one peaks near 150 MB RSS; see
# docs/reliability.md (soak) for why there is no task-count recycling.
CELERY_WORKER_MAX_MEMORY_PER_CHILD = (
    env_int("FAULTLINE_WORKER_MAX_MEMORY_MB", 512, minimum=64) * 1024
)
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
# Failed password checks per (username, client IP) before 429, and how long that lasts.
LOGIN_FAILURE_LIMIT = env_int("FAULTLINE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
LOGIN_LOCKOUT_S = env_int("FAULTLINE_LOGIN_LOCKOUT_S", 300, minimum=1)
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

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
        # Token first so an anonymous caller gets 401 + WWW-Authenticate, not 403.
        "rest_framework.authentication.TokenAuthentication",
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
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 200,
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Faultline API",
    "DESCRIPTION": "Incident console for GPU training and LLM-serving fleets.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",  # served locally: the console works with no internet
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Web serving: HTTP and websockets may sit on different ports (see README).
FAULTLINE_WS_PORT = env_int("FAULTLINE_WS_PORT", 0, minimum=0)

# Ingest limits and diagnosis cadence.
INGEST_RATE_PER_MIN = env_int("FAULTLINE_INGEST_RATE_PER_MIN", 600, minimum=1)
INGEST_MAX_FUTURE_S = env_int("FAULTLINE_INGEST_MAX_FUTURE_S", 300, minimum=1)
TELEMETRY_RETENTION_DAYS = env_int("FAULTLINE_RETENTION_DAYS", 14, minimum=1)
DIAGNOSIS_DEBOUNCE_MS = env_int("FAULTLINE_DIAGNOSIS_DEBOUNCE_MS", 200, minimum=0)
# Operator overrides of the Xid catalog (agents/xid.py): a TOML or JSON file of
# code -> {class, action, investigatory}; read once at startup (console/apps.py).
XID_OVERRIDES_FILE = env_str("FAULTLINE_XID_OVERRIDES") or None

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("FAULTLINE_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
