"""`faultline` command line: run the whole service, issue agent tokens, manage users.

`faultline up` is a small supervisor: it starts (or adopts) the embedded Postgres and Valkey
when DATABASE_URL / REDIS_URL are unset, migrates, creates the first admin, then runs
gunicorn (HTTP), uvicorn (websockets), a Celery worker and Celery beat as children, restarts
a child that dies, and stops everything on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from faultline import metrics_dir
from faultline.embedded import Embedded, EmbeddedError, port_in_use, start_embedded


def _data_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("FAULTLINE_DATA_DIR") or Path.cwd() / ".faultline").resolve()


def _runtime_file(data_dir: Path) -> Path:
    return data_dir / "runtime.json"


def write_runtime(data_dir: Path, args: argparse.Namespace) -> None:
    """What a running `faultline up`/`demo` is: pid, URLs and ports (tests and tools read it)."""
    _runtime_file(data_dir).write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "DATABASE_URL": os.environ["DATABASE_URL"],
                "REDIS_URL": os.environ["REDIS_URL"],
                "port": args.port,
                "ws_port": args.ws_port,
            }
        )
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _prepare_env(data_dir: Path, *, for_up: bool) -> Embedded:
    """Export DATABASE_URL/REDIS_URL: from env, from a running `up`, or embedded servers."""
    os.environ["FAULTLINE_DATA_DIR"] = str(data_dir)
    runtime = _runtime_file(data_dir)
    if not for_up and runtime.exists():
        info = json.loads(runtime.read_text())
        if _pid_alive(int(info.get("pid", 0))):
            for key in ("DATABASE_URL", "REDIS_URL"):
                if info.get(key):
                    os.environ.setdefault(key, info[key])
    emb = start_embedded(data_dir)
    if emb.database_url:
        os.environ["DATABASE_URL"] = emb.database_url
    if emb.redis_url:
        os.environ["REDIS_URL"] = emb.redis_url
    return emb


def _django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
    import django

    django.setup()


def _close_db() -> None:
    from django.db import connections

    connections.close_all()


def _ensure_admin() -> str | None:
    """Create the first admin; return the generated password (shown once) if we made one."""
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    if user_model.objects.filter(is_superuser=True).exists():
        return None
    username = os.environ.get("FAULTLINE_ADMIN_USER", "admin")
    password = os.environ.get("FAULTLINE_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    user_model.objects.create_superuser(username=username, email="", password=password)
    return f"{username} / {password}"


def _children(args: argparse.Namespace) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "web": [
            py, "-m", "gunicorn", "faultline.wsgi:application",
            "--bind", f"{args.host}:{args.port}", "--workers", str(args.workers),
            # Threads overlap a request's Postgres/Redis waits: same CPU per batch as sync
            # workers, more batches/s than uvicorn here (docs/performance.md).
            "--worker-class", "gthread", "--threads", "4",
            "--graceful-timeout", "10", "--timeout", "60", "--log-level", "warning",
        ],
        "ws": [
            py, "-m", "uvicorn", "faultline.asgi:application", "--host", args.host,
            "--port", str(args.ws_port), "--lifespan", "off", "--log-level", "warning",
        ],
        "worker": [
            py, "-m", "celery", "-A", "faultline", "worker", "--concurrency",
            str(args.worker_concurrency), "--loglevel", "WARNING", "--without-heartbeat",
            "--without-gossip", "--without-mingle",
        ],
        "beat": [
            py, "-m", "celery", "-A", "faultline", "beat", "--loglevel", "WARNING",
            "--schedule", str(_data_dir(args.data_dir) / "celerybeat-schedule"),
        ],
    }  # fmt: skip


class Supervisor:
    """Runs the children, restarts one that dies with backoff, stops all on a signal.

    A child that dies is restarted after 0.5 s, doubling up to 30 s while it keeps dying
    (a Redis blip crashes the Celery worker once; five blips must not take Faultline
    down). Only a child that died GIVE_UP_AFTER times in ten minutes stops the service.
    An embedded Valkey that dies is restarted on its port first (`embedded`).
    """

    GIVE_UP_AFTER = 30

    def __init__(
        self,
        commands: dict[str, list[str]],
        env: dict[str, str],
        embedded: Embedded | None = None,
    ) -> None:
        self.commands, self.env, self.embedded = commands, env, embedded
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, list[float]] = {name: [] for name in commands}
        self.due: dict[str, float] = {}
        self.stopping = False

    def start(self, name: str) -> None:
        self.procs[name] = subprocess.Popen(self.commands[name], env=self.env)

    def run(self) -> int:
        for name in self.commands:
            self.start(name)
        while not self.stopping:
            time.sleep(0.5)
            if self.embedded is not None:
                try:
                    if self.embedded.revive_valkey():
                        print("faultline: embedded Valkey exited; restarted it on its port")
                except EmbeddedError as exc:  # retried on the next tick
                    print(f"faultline: {exc}")
            now = time.monotonic()
            for name, proc in list(self.procs.items()):
                if self.stopping or proc.poll() is None:
                    continue
                if name not in self.due:
                    recent = [t for t in self.restarts[name] if now - t < 600]
                    if len(recent) >= self.GIVE_UP_AFTER:
                        print(f"faultline: {name} died {len(recent)} times in 10 min; stopping")
                        self.stop()
                        return 1
                    self.restarts[name] = [*recent, now]
                    burst = len([t for t in recent if now - t < 60])
                    delay = min(30.0, 0.5 * 2**burst)
                    print(
                        f"faultline: {name} exited with code {proc.returncode}; "
                        f"restarting in {delay:.1f}s"
                    )
                    self.due[name] = now + delay
                if now >= self.due[name]:
                    del self.due[name]
                    self.start(name)
        return 0

    def stop(self) -> None:
        self.stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def cmd_up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    args.ws_port = args.ws_port or args.port + 1
    for port, flag in ((args.port, "--port"), (args.ws_port, "--ws-port")):
        if port_in_use(port, args.host):
            print(f"faultline: port {port} is already in use; choose another with {flag} N")
            return 2
    data_dir = _data_dir(args.data_dir)
    try:
        emb = _prepare_env(data_dir, for_up=True)
    except EmbeddedError as exc:
        print(f"faultline: {exc}")
        return 2
    os.environ["FAULTLINE_WS_PORT"] = str(args.ws_port)
    metrics_dir.prepare(data_dir)  # the children share one Prometheus samples folder
    try:
        _django_setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        login = _ensure_admin()
        _close_db()  # the supervisor holds no connection: Postgres can stop cleanly later
        write_runtime(data_dir, args)
        sup = Supervisor(_children(args), dict(os.environ), embedded=emb)

        def on_signal(signum: int, frame: object) -> None:
            sup.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '') else args.host}:{args.port}/"  # noqa: S104
        embedded = ", ".join(f"{k} {v:.2f}s" for k, v in emb.timings.items()) or "external"
        print(f"faultline: ready in {time.monotonic() - started:.1f}s (embedded: {embedded})")
        if login:
            print(f"faultline: first admin login (shown once): {login}")
        print(f"faultline: console at {url}  (websockets on port {args.ws_port}); Ctrl-C stops")
        sys.stdout.flush()
        code = sup.run()
        sup.stop()
        return code
    finally:
        _runtime_file(data_dir).unlink(missing_ok=True)
        emb.stop(force=True)


def _with_django(args: argparse.Namespace) -> Embedded:
    emb = _prepare_env(_data_dir(getattr(args, "data_dir", None)), for_up=False)
    _django_setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    return emb


def cmd_token(args: argparse.Namespace) -> int:
    emb = _with_django(args)
    try:
        from ingest.auth import issue_token, revoke_tokens

        if args.action == "create":
            token = issue_token(node_name=args.node)
            print(f"agent token for node {args.node} (shown once; store it now):")
            print(token)
        else:
            count = revoke_tokens(node_name=args.node)
            print(f"revoked {count} token(s) of node {args.node}")
        return 0
    finally:
        _close_db()
        emb.stop()


def cmd_user(args: argparse.Namespace) -> int:
    emb = _with_django(args)
    try:
        from console.accounts import create_user

        password = args.password or os.environ.get("FAULTLINE_USER_PASSWORD")
        if not password:
            import getpass

            password = getpass.getpass(f"password for {args.name}: ")
        create_user(username=args.name, role=args.role, password=password)
        print(f"user {args.name} created with role {args.role}")
        return 0
    finally:
        _close_db()
        emb.stop()


def cmd_manage(args: argparse.Namespace) -> int:
    emb = _prepare_env(_data_dir(None), for_up=False)
    try:
        _django_setup()
        from django.core.management import execute_from_command_line

        execute_from_command_line(["faultline manage", *args.rest])
        return 0
    finally:
        _close_db()
        emb.stop()


def cmd_demo(args: argparse.Namespace) -> int:
    from faultline import demo

    return demo.run(args)


def cmd_drill(args: argparse.Namespace) -> int:
    from faultline import drill

    return drill.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole service (web, websockets, worker, beat)")
    up.add_argument("--host", default=os.environ.get("FAULTLINE_HOST", "127.0.0.1"))
    up.add_argument("--port", type=int, default=int(os.environ.get("FAULTLINE_PORT", "8000")))
    up.add_argument("--ws-port", type=int, default=0, help="websocket port (default: port+1)")
    up.add_argument("--workers", type=int, default=2, help="gunicorn HTTP workers")
    up.add_argument("--worker-concurrency", type=int, default=2, help="Celery processes")
    up.add_argument("--data-dir", default=None, help="embedded data (FAULTLINE_DATA_DIR)")
    up.set_defaults(func=cmd_up)

    token = sub.add_parser("token", help="agent tokens")
    token.add_argument("action", choices=["create", "revoke"])
    token.add_argument("node")
    token.add_argument("--data-dir", default=None)
    token.set_defaults(func=cmd_token)

    user = sub.add_parser("user", help="console users")
    user.add_argument("action", choices=["create"])
    user.add_argument("name")
    user.add_argument("--role", choices=["viewer", "operator", "approver", "admin"], required=True)
    user.add_argument("--password", default=None, help="or FAULTLINE_USER_PASSWORD, or a prompt")
    user.add_argument("--data-dir", default=None)
    user.set_defaults(func=cmd_user)

    demo = sub.add_parser("demo", help="the service plus a simulated fleet that fails live")
    demo.add_argument("--host", default=os.environ.get("FAULTLINE_HOST", "127.0.0.1"))
    demo.add_argument("--port", type=int, default=int(os.environ.get("FAULTLINE_PORT", "8000")))
    demo.add_argument("--ws-port", type=int, default=0, help="websocket port (default: port+1)")
    demo.add_argument("--workers", type=int, default=2, help="gunicorn HTTP workers")
    demo.add_argument("--worker-concurrency", type=int, default=1, help="Celery processes")
    demo.add_argument("--data-dir", default=None, help="embedded data (FAULTLINE_DATA_DIR)")
    demo.add_argument("--nodes", type=int, default=16, help="simulated nodes (at least 3)")
    demo.add_argument("--gpus", type=int, default=8, help="fake GPUs per node")
    demo.add_argument("--schedule", choices=["demo", "fast", "none"], default="demo")
    demo.add_argument("--seed", type=int, default=7, help="which ranks the faults hit")
    demo.set_defaults(func=cmd_demo)

    drill = sub.add_parser("drill", help="inject real faults into a real PyTorch CPU job")
    drill.add_argument("--quick", action="store_true", help="the short set (about 3 minutes)")
    drill.add_argument("--only", action="append", default=None, help="run just this drill")
    drill.add_argument("--json", dest="json_out", default=None, help="write results as JSON")
    drill.add_argument("--markdown", default=None, help="write results as a Markdown table")
    drill.add_argument("--data-dir", default=None, help="work directory (default: a temp dir)")
    drill.set_defaults(func=cmd_drill)

    manage = sub.add_parser("manage", help="run a Django management command")
    manage.add_argument("rest", nargs=argparse.REMAINDER)
    manage.set_defaults(func=cmd_manage)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
