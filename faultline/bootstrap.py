"""Bringing the system up: what `faultline up`, `faultline demo` and the CLI's one-shot
commands share before anything is supervised.

Owns the data directory and its `runtime.json`, starting (or adopting) the embedded
Postgres and Valkey and exporting their URLs, Django set-up and migrations, the first admin
user and how its password is shown, and the service children's command lines. `faultline
drill` reaches all of this through a real `faultline up` child (faultline.testing.service).
Must not run or restart processes (faultline.supervisor does) and must not parse arguments
(faultline.cli does).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from faultline import dbroles, metrics_dir
from faultline.embedded import Embedded, EmbeddedError, port_in_use, start_embedded

# The generated first-admin password, when it cannot be shown on a terminal.
ADMIN_PASSWORD_FILE = "admin-password"  # noqa: S105 - a file name, not a password


class BootstrapError(RuntimeError):
    """The system cannot come up (busy port, embedded server failed): exit 2 with this."""


def data_dir(arg: str | None) -> Path:
    """--data-dir, else FAULTLINE_DATA_DIR, else ./.faultline (absolute)."""
    return Path(arg or os.environ.get("FAULTLINE_DATA_DIR") or Path.cwd() / ".faultline").resolve()


def runtime_file(directory: Path) -> Path:
    return directory / "runtime.json"


def write_runtime(directory: Path, *, port: int, ws_port: int) -> None:
    """What a running `faultline up`/`demo` is: pid, URLs and ports (tests and tools read it)."""
    runtime_file(directory).write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "DATABASE_URL": os.environ["DATABASE_URL"],
                "REDIS_URL": os.environ["REDIS_URL"],
                "port": port,
                "ws_port": ws_port,
            }
        )
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def prepare_env(
    directory: Path, *, adopt_running: bool, avoid_ports: frozenset[int] = frozenset()
) -> Embedded:
    """Export DATABASE_URL/REDIS_URL: from the environment, from a running `faultline up`
    (when `adopt_running`, for one-shot commands beside it), or from embedded servers
    (never on `avoid_ports`: the web and websocket ports, not bound yet)."""
    os.environ["FAULTLINE_DATA_DIR"] = str(directory)
    runtime = runtime_file(directory)
    if adopt_running and runtime.exists():
        info = json.loads(runtime.read_text())
        if _pid_alive(int(info.get("pid", 0))):
            for key in ("DATABASE_URL", "REDIS_URL"):
                if info.get(key):
                    os.environ.setdefault(key, info[key])
    emb = start_embedded(directory, avoid_ports=avoid_ports)
    if emb.database_url:
        os.environ["DATABASE_URL"] = emb.database_url
    if emb.redis_url:
        os.environ["REDIS_URL"] = emb.redis_url
    return emb


def django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
    import django

    django.setup()


def migrate() -> None:
    """Apply migrations. Without the service's lock timeout: a migration runs once, before
    (or, in an upgrade, beside) the service, and is better waited for than failed half-way
    through a deployment (docs/operations.md, "Lock waits")."""
    from django.core.management import call_command
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = 0")
    call_command("migrate", interactive=False, verbosity=0)


def close_db() -> None:
    """Drop this process's connections: a supervisor holds none, so Postgres stops cleanly."""
    from django.db import connections

    connections.close_all()


@contextlib.contextmanager
def django_ready(data_dir_arg: str | None) -> Iterator[None]:
    """For one-shot commands (token, user): database URLs, Django, migrations; then clean up."""
    emb = prepare_env(data_dir(data_dir_arg), adopt_running=True)
    try:
        django_setup()
        migrate()
        yield
    finally:
        close_db()
        emb.stop()


@dataclass(frozen=True)
class AdminLogin:
    """The first admin that `ensure_admin` created; `generated` when we chose the password."""

    username: str
    password: str = field(repr=False)
    generated: bool


def ensure_admin() -> AdminLogin | None:
    """Create the first admin unless a superuser exists; return who was created. Raises
    BootstrapError when FAULTLINE_ADMIN_PASSWORD fails the password validators."""
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    if user_model.objects.filter(is_superuser=True).exists():
        return None
    username = os.environ.get("FAULTLINE_ADMIN_USER", "admin")
    given = os.environ.get("FAULTLINE_ADMIN_PASSWORD")
    if given:
        # The first admin's password passes the same validators as every other password
        # (settings.AUTH_PASSWORD_VALIDATORS): a weak one stops `faultline up`, loudly.
        from django.contrib.auth.password_validation import validate_password
        from django.core.exceptions import ValidationError

        try:
            validate_password(given, user=user_model(username=username))
        except ValidationError as exc:
            raise BootstrapError(
                f"FAULTLINE_ADMIN_PASSWORD is refused for {username}: {' '.join(exc.messages)} "
                "Choose a stronger one, or unset it to have one generated."
            ) from None
    password = given or secrets.token_urlsafe(12)
    user_model.objects.create_superuser(username=username, email="", password=password)
    return AdminLogin(username, password, generated=not given)


def announce_admin(login: AdminLogin, directory: Path, out: TextIO | None = None) -> None:
    """Tell the operator how to log in, without writing a password into a log.

    A generated password is printed once when `out` is a terminal; otherwise (output
    redirected to a file such as up.log) it goes to `<data dir>/admin-password`, mode 0600,
    and only that path is printed. A password from FAULTLINE_ADMIN_PASSWORD is never shown.
    """
    out = out or sys.stdout
    if not login.generated:
        print(
            f"faultline: first admin login: {login.username} "
            "(password from FAULTLINE_ADMIN_PASSWORD)",
            file=out,
        )
    elif out.isatty():
        print(
            f"faultline: first admin login (shown once): {login.username} / {login.password}",
            file=out,
        )
    else:
        path = write_admin_password(directory, login.password)
        print(
            f"faultline: first admin login: {login.username}, password in {path} (mode 0600)",
            file=out,
        )


def write_admin_password(directory: Path, password: str) -> Path:
    """Write the password to a file only its owner can read (created 0600, never wider)."""
    path = directory / ADMIN_PASSWORD_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(password + "\n")
    return path


def public_host(host: str) -> str:
    """The host to print in URLs: a wildcard bind is reached on 127.0.0.1."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else host  # noqa: S104


@dataclass
class System:
    """A system that is up to the point of supervision: data dir, embedded servers, admin."""

    data_dir: Path
    embedded: Embedded
    admin: AdminLogin | None
    started: float
    port: int
    ws_port: int

    def hand_over(self) -> None:
        """Close our connections and write runtime.json: the supervisor takes over now."""
        close_db()
        write_runtime(self.data_dir, port=self.port, ws_port=self.ws_port)

    def embedded_timings(self) -> str:
        return ", ".join(f"{k} {v:.2f}s" for k, v in self.embedded.timings.items()) or "external"


@contextlib.contextmanager
def system_up(*, host: str, port: int, ws_port: int, data_dir_arg: str | None) -> Iterator[System]:
    """Check ports, start or adopt the embedded servers, migrate, create the first admin.

    Raises BootstrapError before anything is started if a port is busy or an embedded
    server cannot start. On exit removes runtime.json and stops the embedded servers.
    """
    started = time.monotonic()
    for busy, flag in ((port, "--port"), (ws_port, "--ws-port")):
        if port_in_use(busy, host):
            raise BootstrapError(f"port {busy} is already in use; choose another with {flag} N")
    directory = data_dir(data_dir_arg)
    try:
        emb = prepare_env(directory, adopt_running=False, avoid_ports=frozenset({port, ws_port}))
    except EmbeddedError as exc:
        raise BootstrapError(str(exc)) from exc
    os.environ["FAULTLINE_WS_PORT"] = str(ws_port)
    metrics_dir.prepare(directory)  # the children share one Prometheus samples folder
    try:
        django_setup()
        migrate()
        admin = ensure_admin()
        if emb.database_url:
            # The children run as faultline_app, which may only append to the audit log
            # (faultline.dbroles); this process keeps the owner's connection for migrate.
            os.environ["DATABASE_URL"] = dbroles.embedded_app_url(emb.database_url, directory)
        yield System(directory, emb, admin, started, port, ws_port)
    finally:
        runtime_file(directory).unlink(missing_ok=True)
        emb.stop(force=True)


# Agents keep one connection open between batches (agents/sender.py): the idle timeout must
# outlast their send interval (at most 5 s) so a fleet at rest does not pay a TCP accept and
# close per batch; gthread parks idle connections in its poller, not in a thread, up to
# --worker-connections each (past that, answers close the connection: a connection per
# batch again, never a refusal). SO_REUSEPORT gives each worker its own listening socket,
# so the kernel spreads the fleet's connections over the workers instead of the first
# worker to wake taking them all (docs/performance.md).
WEB_KEEPALIVE = ("--keep-alive", "30", "--worker-connections", "4000", "--reuse-port")
# The websocket port (faultline.asgi answers any plain HTTP request 404): uvicorn believes
# no forwarded header (its default trusts X-Forwarded-For from 127.0.0.1), and a client's
# websocket message is small (the console sends none).
WS_ONLY = ("--no-proxy-headers", "--ws-max-size", "65536")


def forwarded_allow_ips() -> tuple[str, ...]:
    """gunicorn believes X-Forwarded-Proto only from FAULTLINE_TRUSTED_PROXIES (default: from
    nobody; gunicorn's own default is 127.0.0.1, so anything on the host could claim https)."""
    from faultline.env import env_networks

    return (
        "--forwarded-allow-ips",
        ",".join(str(n) for n in env_networks("FAULTLINE_TRUSTED_PROXIES")),
    )


def raise_open_files_limit(want: int = 65536) -> int:
    """Lift this process's soft open-files limit towards the hard one (the children inherit
    it): each kept-alive agent connection is a file, and a gunicorn worker that hits the
    limit in accept() dies with all its connections. Returns the soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


def service_commands(
    *, host: str, port: int, ws_port: int, workers: int, worker_concurrency: int, directory: Path
) -> dict[str, list[str]]:
    """The children of the service: HTTP, websockets, the Celery workers and beat.

    Four workers, one queue each, so no queue waits behind another's work: `worker`
    drains the default queue (diagnosis passes), `worker-urgent` the urgent diagnosis
    lane (console.scheduling.URGENT_QUEUE), one process, so an established group's Xid
    starts at once however far behind the first one is, `worker-housekeeping` beat's
    sweeps (HOUSEKEEPING_QUEUE: pages scheduled, silent nodes marked down, quiet groups
    re-judged, step bins rolled), one process, and `worker-notify` the pages themselves
    (NOTIFY_QUEUE), four threads of one process: a send waits on a remote endpoint."""
    py = sys.executable
    return {
        "web": [
            py,
            "-m",
            "gunicorn",
            "faultline.wsgi:application",
            "--bind",
            f"{host}:{port}",
            "--workers",
            str(workers),
            # Threads overlap a request's Postgres/Redis waits: same CPU per batch as sync
            # workers, more batches/s than uvicorn here (docs/performance.md).
            "--worker-class",
            "gthread",
            "--threads",
            "4",
            *WEB_KEEPALIVE,
            "--graceful-timeout",
            "10",
            "--timeout",
            "60",
            "--log-level",
            "warning",
            *forwarded_allow_ips(),
        ],
        "ws": [
            py,
            "-m",
            "uvicorn",
            "faultline.asgi:application",
            "--host",
            host,
            "--port",
            str(ws_port),
            "--lifespan",
            "off",
            "--log-level",
            "warning",
            *WS_ONLY,
        ],
        "worker": [
            py,
            "-m",
            "celery",
            "-A",
            "faultline",
            "worker",
            "--queues",
            "celery",
            "--concurrency",
            str(worker_concurrency),
            "--loglevel",
            "WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        "worker-urgent": [
            py,
            "-m",
            "celery",
            "-A",
            "faultline",
            "worker",
            "--queues",
            "diagnose-urgent",
            "--hostname",
            "urgent@%h",
            "--concurrency",
            "1",
            "--loglevel",
            "WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        "worker-housekeeping": [
            py,
            "-m",
            "celery",
            "-A",
            "faultline",
            "worker",
            "--queues",
            "housekeeping",
            "--hostname",
            "housekeeping@%h",
            "--concurrency",
            "1",
            "--loglevel",
            "WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        "worker-notify": [
            py,
            "-m",
            "celery",
            "-A",
            "faultline",
            "worker",
            "--queues",
            "notify",
            "--hostname",
            "notify@%h",
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--loglevel",
            "WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        "beat": [
            py,
            "-m",
            "celery",
            "-A",
            "faultline",
            "beat",
            "--loglevel",
            "WARNING",
            "--schedule",
            str(directory / "celerybeat-schedule"),
        ],
    }
