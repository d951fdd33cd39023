"""`faultline` command line: run the whole service, issue agent tokens, manage users.

Owns the arguments and the dispatch to one function per command: bringing the system up is
faultline.bootstrap, keeping its children running is faultline.supervisor, the demo and the
drills are faultline.demo and faultline.drill, backup and restore faultline.backup, the audit
chain console.auditchain. Must not hold the logic of any of them.

`faultline up` starts (or adopts) the embedded Postgres and Valkey when DATABASE_URL /
REDIS_URL are unset, migrates, creates the first admin, then runs gunicorn (HTTP), uvicorn
(websockets), four Celery workers (default queue, urgent lane, housekeeping, notify) and Celery
beat as children, restarts a child that dies, and
stops everything on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from faultline import bootstrap
from faultline.supervisor import Supervisor


def cmd_up(args: argparse.Namespace) -> int:
    args.ws_port = args.ws_port or args.port + 1
    try:
        with bootstrap.system_up(
            host=args.host, port=args.port, ws_port=args.ws_port, data_dir_arg=args.data_dir
        ) as system:
            system.hand_over()
            bootstrap.raise_open_files_limit()
            commands = bootstrap.service_commands(
                host=args.host,
                port=args.port,
                ws_port=args.ws_port,
                workers=args.workers,
                worker_concurrency=args.worker_concurrency,
                directory=system.data_dir,
            )
            sup = Supervisor(commands, dict(os.environ), embedded=system.embedded)
            sup.handle_signals()
            url = f"http://{bootstrap.public_host(args.host)}:{args.port}/"
            ready_s = time.monotonic() - system.started
            print(f"faultline: ready in {ready_s:.1f}s (embedded: {system.embedded_timings()})")
            if system.admin is not None:
                bootstrap.announce_admin(system.admin, system.data_dir)
            print(f"faultline: console at {url}  (websockets on port {args.ws_port}); Ctrl-C stops")
            return sup.serve()
    except bootstrap.BootstrapError as exc:
        print(f"faultline: {exc}")
        return 2


def cmd_token(args: argparse.Namespace) -> int:
    with bootstrap.django_ready(args.data_dir):
        from ingest.auth import issue_token, revoke_tokens

        if args.action == "create":
            token = issue_token(
                node_name=args.node, launcher_group=args.launcher or "", actor="cli"
            )
            scope = f" (launcher of group {args.launcher})" if args.launcher else ""
            print(f"agent token for node {args.node}{scope} (shown once; store it now):")
            print(token)
        else:
            count = revoke_tokens(node_name=args.node, actor="cli")
            print(f"revoked {count} token(s) of node {args.node}")
        return 0


def cmd_user(args: argparse.Namespace) -> int:
    with bootstrap.django_ready(args.data_dir):
        from django.contrib.auth import get_user_model
        from django.contrib.auth.password_validation import validate_password
        from django.core.exceptions import ValidationError

        from console.actions import create_user

        password = args.password or os.environ.get("FAULTLINE_USER_PASSWORD")
        if not password:
            import getpass

            password = getpass.getpass(f"password for {args.name}: ")
        try:
            validate_password(password, user=get_user_model()(username=args.name))
        except ValidationError as exc:
            print(f"faultline: password refused for {args.name}: {' '.join(exc.messages)}")
            return 2
        create_user(actor="cli", username=args.name, role=args.role, password=password)
        print(f"user {args.name} created with role {args.role}")
        return 0


def cmd_manage(args: argparse.Namespace) -> int:
    emb = bootstrap.prepare_env(bootstrap.data_dir(None), adopt_running=True)
    try:
        bootstrap.django_setup()
        from django.core.management import execute_from_command_line

        execute_from_command_line(["faultline manage", *args.rest])
        return 0
    finally:
        bootstrap.close_db()
        emb.stop()


def cmd_demo(args: argparse.Namespace) -> int:
    from faultline.demo.runner import run

    return run(args)


def cmd_drill(args: argparse.Namespace) -> int:
    from faultline import drill

    return drill.run(args)


def cmd_report(args: argparse.Namespace) -> int:
    """`faultline report --days N`: the fleet's reliability record as Markdown and JSON."""
    import json
    from pathlib import Path

    with bootstrap.django_ready(args.data_dir):
        from django.utils import timezone

        from console.diagnosis.reliability import markdown
        from console.queries.recovery import fleet_report

        report = fleet_report(days=args.days, now=timezone.now())
    text = markdown(report)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    if not args.markdown:
        print(text, end="")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """`faultline audit verify`: walk the audit log's hash chain; non-zero at the first break."""
    with bootstrap.django_ready(args.data_dir):
        from console import auditchain

        report = auditchain.verify()
    print(report.describe())
    return 0 if report.ok else 1


def cmd_backup(args: argparse.Namespace) -> int:
    """`faultline backup FILE`: pg_dump -Fc of the service's database."""
    from pathlib import Path

    from faultline import backup

    try:
        with backup.database_url(bootstrap.data_dir(args.data_dir)) as url:
            result = backup.backup(url, Path(args.file))
    except backup.BackupError as exc:
        print(f"faultline: backup refused: {exc}", file=sys.stderr)
        return 2
    print(f"backup: wrote {result.path} ({result.bytes / 1e6:.1f} MB) in {result.seconds:.1f}s")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    """`faultline restore FILE [--force]`: pg_restore into an empty database."""
    from pathlib import Path

    from faultline import backup

    try:
        with backup.database_url(bootstrap.data_dir(args.data_dir)) as url:
            result = backup.restore(url, Path(args.file), force=args.force)
    except backup.BackupError as exc:
        print(f"faultline: restore refused: {exc}", file=sys.stderr)
        return 2
    print(f"restore: {result.tables} tables from {result.path} in {result.seconds:.1f}s")
    print(
        "restore: next, `faultline audit verify`; with an external Postgres also "
        "`faultline manage db_roles` (grants are not restored)"
    )
    return 0


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
    token.add_argument("--launcher", metavar="GROUP", help="may send this group's transitions")
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
    drill.add_argument("--list", action="store_true", help="print the matrix; run nothing")
    drill.add_argument(
        "--remediation",
        action="store_true",
        help="the remediation drill: Xid -> node out of service on Slurm (real if present, "
        "else a fake scontrol) -> job requeued; no PyTorch needed",
    )
    drill.add_argument(
        "--fake-scheduler",
        action="store_true",
        help="--remediation on the fake scontrol even where a real Slurm could start",
    )
    drill.set_defaults(func=cmd_drill)

    report = sub.add_parser("report", help="the fleet's reliability record (Markdown, JSON)")
    report.add_argument("--days", type=float, default=30.0, help="the window (default 30)")
    report.add_argument("--json", dest="json_out", default=None, help="write the figures as JSON")
    report.add_argument("--markdown", default=None, help="write Markdown here (else stdout)")
    report.add_argument("--data-dir", default=None, help="the service's data directory")
    report.set_defaults(func=cmd_report)

    dump = sub.add_parser("backup", help="dump the database to FILE (pg_dump -Fc)")
    dump.add_argument("file")
    dump.add_argument("--data-dir", default=None, help="the service's data directory")
    dump.set_defaults(func=cmd_backup)

    load = sub.add_parser("restore", help="restore FILE into an empty database (pg_restore)")
    load.add_argument("file")
    load.add_argument("--force", action="store_true", help="drop and replace existing tables")
    load.add_argument("--data-dir", default=None, help="the service's data directory")
    load.set_defaults(func=cmd_restore)

    audit = sub.add_parser("audit", help="check the audit log's hash chain")
    audit.add_argument("action", choices=["verify"])
    audit.add_argument("--data-dir", default=None, help="the service's data directory")
    audit.set_defaults(func=cmd_audit)

    manage = sub.add_parser("manage", help="run a Django management command")
    manage.add_argument("rest", nargs=argparse.REMAINDER)
    manage.set_defaults(func=cmd_manage)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
