"""`faultline-agent` command line: run, check, version.

Owns turning flags, environment and an optional TOML file into an `agents.agent.Config`
(precedence: flag > environment > TOML > default) and the human-facing output of `check`.
It must not hold agent logic; `main()` is the console-script entry point.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agents import __version__, xid
from agents.agent import DEFAULT_STATE_DIR, Agent, Config, make_backend
from agents.checkpoints import RootConfig
from agents.replay import DEFAULT_WINDOW_S, MAX_REPLAY_WINDOW_S
from agents.schedulers import backend_named
from agents.sender import opener_for
from agents.serving_scrape import EngineScraper, parse_config
from agents.spool import Identity, Spool
from agents.wire import MAX_SEND_INTERVAL_S


class ConfigError(ValueError):
    """Bad configuration; the message names the setting, the value and the fix."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faultline-agent", description="Faultline node agent")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("run", "collect and ship telemetry until SIGTERM"),
        ("check", "check GPUs, driver, spool and server; exit 1 on a problem"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", type=Path, help="TOML file (keys as the long flags)")
        p.add_argument("--server", help="service URL, e.g. https://faultline.example:8443")
        p.add_argument("--token", help="agent token (or FAULTLINE_AGENT_TOKEN[_FILE])")
        p.add_argument("--node", help="node name (default: hostname)")
        p.add_argument("--fake-gpus", type=int, help="use N fake GPUs instead of NVML")
        p.add_argument(
            "--dcgm-url",
            help="read GPUs from a local dcgm-exporter instead of NVML, "
            "e.g. http://127.0.0.1:9400/metrics",
        )
        p.add_argument(
            "--fake-script",
            action="append",
            default=None,
            help="fake GPU fault, e.g. 0:temp_ramp or 3:xid79 (repeatable)",
        )
        p.add_argument("--interval", type=float, help="sampling interval, seconds (default 1)")
        p.add_argument(
            "--send-interval",
            type=float,
            help="seconds between batches (default: the sampling interval; at most "
            f"{MAX_SEND_INTERVAL_S:g}); "
            "device events and process exits still go at once",
        )
        p.add_argument("--state-dir", type=Path, help=f"default {DEFAULT_STATE_DIR}")
        p.add_argument(
            "--replay-window",
            type=float,
            help="seconds an acknowledged batch is kept to re-send what a database failover "
            f"lost (default {DEFAULT_WINDOW_S:g}; at least the replication-lag bound; 0: none)",
        )
        p.add_argument(
            "--checkpoint-root",
            action="append",
            default=None,
            help="checkpoint root to watch (repeatable)",
        )
        p.add_argument(
            "--dry-run",
            action="store_true",
            default=None,
            help="print batches instead of sending; hooks are not run",
        )
        p.add_argument(
            "--boot-id",
            help="boot id to report (or FAULTLINE_AGENT_BOOT_ID; default: the kernel's "
            "/proc/sys/kernel/random/boot_id); a new one simulates a reboot",
        )
        p.add_argument("--log-level", default=os.environ.get("FAULTLINE_AGENT_LOG", "INFO"))
    sub.add_parser("version", help="print the agent version")
    return parser


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} must be a number") from None


def _token(args: argparse.Namespace, toml: dict[str, Any]) -> str:
    if args.token:
        return str(args.token)
    if os.environ.get("FAULTLINE_AGENT_TOKEN"):
        return os.environ["FAULTLINE_AGENT_TOKEN"]
    token_file = os.environ.get("FAULTLINE_AGENT_TOKEN_FILE") or toml.get("token_file")
    if token_file:
        try:
            return Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"token file {token_file}: {exc.strerror}") from None
    return str(toml.get("token", ""))


def _roots(flags: list[str] | None, toml: dict[str, Any]) -> list[RootConfig]:
    if flags:
        return [RootConfig(Path(p)) for p in flags]
    roots = []
    for item in toml.get("checkpoint_roots", []):
        if isinstance(item, str):
            roots.append(RootConfig(Path(item)))
        elif isinstance(item, dict) and "path" in item:
            shared = item.get("shared", False)
            if not isinstance(shared, bool):
                raise ConfigError(f"checkpoint_roots entry {item!r}: shared must be true or false")
            roots.append(
                RootConfig(Path(item["path"]), item.get("group"), item.get("generation"), shared)
            )
        else:
            raise ConfigError(
                f"checkpoint_roots entry {item!r} must be a path or "
                "{path=..., group=..., generation=..., shared=...}"
            )
    return roots


def build_config(args: argparse.Namespace) -> Config:
    toml: dict[str, Any] = {}
    config_path = args.config or (
        Path(p) if (p := os.environ.get("FAULTLINE_AGENT_CONFIG")) else None
    )
    if config_path is not None:
        try:
            toml = tomllib.loads(Path(config_path).read_text())
        except OSError as exc:
            raise ConfigError(f"config file {config_path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_path}: {exc}") from None
    cfg = Config()

    def pick(flag: Any, env: str, key: str, default: Any) -> Any:
        if flag is not None:
            return flag
        if os.environ.get(env) not in (None, ""):
            return os.environ[env]
        return toml.get(key, default)

    cfg.server = str(pick(args.server, "FAULTLINE_SERVER", "server", ""))
    cfg.token = _token(args, toml)
    cfg.node = str(pick(args.node, "FAULTLINE_NODE", "node", cfg.node))
    cfg.state_dir = Path(
        pick(args.state_dir, "FAULTLINE_AGENT_STATE_DIR", "state_dir", DEFAULT_STATE_DIR)
    )
    interval = (
        args.interval if args.interval is not None else _env_float("FAULTLINE_AGENT_INTERVAL")
    )
    cfg.interval = float(interval if interval is not None else toml.get("interval", 1.0))
    if cfg.interval <= 0:
        raise ConfigError(f"interval {cfg.interval} must be > 0 seconds")
    send = (
        args.send_interval
        if args.send_interval is not None
        else _env_float("FAULTLINE_AGENT_SEND_INTERVAL")
    )
    send = send if send is not None else toml.get("send_interval")
    cfg.send_interval = None if send is None else float(send)
    if cfg.send_interval is not None and not 0 < cfg.send_interval <= MAX_SEND_INTERVAL_S:
        raise ConfigError(
            f"send_interval {cfg.send_interval} must be > 0 and at most "
            f"{MAX_SEND_INTERVAL_S:g} seconds: the service calls a node silent after 10 s "
            "without a batch"
        )
    cfg.fake_gpus = int(args.fake_gpus if args.fake_gpus is not None else toml.get("fake_gpus", 0))
    cfg.fake_scripts = list(args.fake_script or toml.get("fake_scripts", []))
    cfg.dcgm_url = getattr(args, "dcgm_url", None) or toml.get("dcgm_url")
    cfg.checkpoint_roots = _roots(args.checkpoint_root, toml)
    boot = pick(args.boot_id, "FAULTLINE_AGENT_BOOT_ID", "boot_id", None)
    cfg.boot_id = str(boot) if boot else None
    cfg.dry_run = bool(args.dry_run if args.dry_run is not None else toml.get("dry_run", False))
    cfg.spool_max_bytes = int(toml.get("spool_max_mb", 256)) * 1024 * 1024
    window = pick(args.replay_window, "FAULTLINE_AGENT_REPLAY_WINDOW_S", "replay_window_s", None)
    try:
        cfg.replay_window_s = float(window if window is not None else DEFAULT_WINDOW_S)
    except (TypeError, ValueError):
        raise ConfigError(f"replay_window_s {window!r} must be a number of seconds") from None
    if not 0 <= cfg.replay_window_s <= MAX_REPLAY_WINDOW_S:
        raise ConfigError(
            f"replay_window_s {cfg.replay_window_s:g} must be 0 (none) to "
            f"{MAX_REPLAY_WINDOW_S:g} seconds"
        )
    cfg.replay_max_bytes = int(toml.get("replay_max_mb", 64)) * 1024 * 1024
    cfg.reporter_socket = toml.get("reporter_socket")
    cfg.reporter_udp_port = toml.get("reporter_udp_port")
    mode = toml.get("reporter_socket_mode", "660")
    try:
        cfg.reporter_socket_mode = int(str(mode), 8)
    except ValueError:
        raise ConfigError(f'reporter_socket_mode {mode!r} must be octal, e.g. "660"') from None
    cfg.hooks = {str(k): str(v) for k, v in toml.get("hooks", {}).items()}
    kinds = toml.get("allowed_kinds")
    if kinds is not None and not (
        isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)
    ):
        raise ConfigError(f"allowed_kinds must be a list of action kinds, got {kinds!r}")
    cfg.allowed_kinds = None if kinds is None else [str(k) for k in kinds]
    gpus = toml.get("gpus", [])
    if not (isinstance(gpus, list) and all(isinstance(g, str) for g in gpus)):
        raise ConfigError(f"gpus must be a list of GPU UUIDs, got {gpus!r}")
    cfg.gpus = list(gpus)
    allow_unsigned = toml.get("allow_unsigned", False)
    if os.environ.get("FAULTLINE_AGENT_ALLOW_UNSIGNED") not in (None, ""):
        allow_unsigned = os.environ["FAULTLINE_AGENT_ALLOW_UNSIGNED"].lower() in (
            "1",
            "true",
            "yes",
        )
    if not isinstance(allow_unsigned, bool):
        raise ConfigError(f"allow_unsigned must be true or false, got {allow_unsigned!r}")
    cfg.allow_unsigned = allow_unsigned
    cfg.scheduler = str(toml.get("scheduler") or "") or None
    try:
        backend_named(cfg.scheduler)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    controller = toml.get("controller", False)
    if not isinstance(controller, bool):
        raise ConfigError(f"controller must be true or false, got {controller!r}")
    nodes = toml.get("controller_nodes", ["*"])
    if not (isinstance(nodes, list) and nodes and all(isinstance(n, str) and n for n in nodes)):
        raise ConfigError(
            f'controller_nodes must be a list of node name globs, e.g. ["gpu-*"], got {nodes!r}'
        )
    if controller and not (cfg.scheduler or cfg.hooks):
        raise ConfigError(
            'controller = true needs scheduler = "slurm" or "kubernetes" (or [hooks]) to act '
            "on other nodes with"
        )
    cfg.controller, cfg.controller_nodes = controller, [str(n) for n in nodes]
    cfg.hook_timeout_s = float(toml.get("hook_timeout_s", 60.0))
    cfg.action_poll_s = float(toml.get("action_poll_s", 15.0))
    cfg.verify_rate_mb_s = float(toml.get("verify_rate_mb_s", 100.0))
    host = toml.get("host", {})  # [host] of agent.toml (docs/agent.md)
    cfg.host_evidence = bool(host.get("enabled", True))
    cfg.host_interval = float(host.get("interval", 5.0))
    cfg.kmsg_path = str(host.get("kmsg", "/dev/kmsg"))
    cfg.sys_root = Path(host.get("sys_root", "/sys"))
    cfg.proc_root = Path(host.get("proc_root", "/proc"))
    if host.get("net_sys_root"):
        cfg.net_sys_root = Path(host["net_sys_root"])
    if host.get("net_dir"):
        cfg.net_dir = Path(host["net_dir"])
    if host.get("net_ns"):
        cfg.net_ns = Path(host["net_ns"])
    interfaces = host.get("interfaces", [])
    if not (isinstance(interfaces, list) and all(isinstance(i, str) for i in interfaces)):
        raise ConfigError(f"[host] interfaces must be a list of names, got {interfaces!r}")
    cfg.interfaces = list(interfaces)
    try:
        cfg.serving = parse_config(toml.get("serving"), cfg.node)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    overrides = toml.get("xid_overrides")
    if overrides:
        try:
            cfg.xid_catalog = xid.CATALOG.with_overrides(overrides, source="[xid_overrides]")
        except xid.OverrideError as exc:
            raise ConfigError(str(exc)) from None
    if not cfg.dry_run and (not cfg.server or not cfg.token):
        raise ConfigError(
            "a server and a token are needed: pass --server URL and --token "
            "(or FAULTLINE_AGENT_TOKEN / FAULTLINE_AGENT_TOKEN_FILE), or --dry-run"
        )
    return cfg


def check(cfg: Config) -> int:
    """Print what the agent would see; 0 when everything needed works."""
    problems: list[str] = []
    backend = make_backend(cfg, sys.stdout)
    if backend is None:
        problems.append("no GPU collection (NVML missing)")
    else:
        print(f"driver: {backend.driver_version() or 'unknown'} ({backend.name})")
        for i in range(backend.device_count()):
            sample = backend.sample(i)
            print(
                f"gpu {i}: {backend.uuid(i)} temp_c={sample.get('temp_c')} "
                f"power_w={sample.get('power_w')} throttle={sample.get('throttle_reasons')}"
            )
        if backend.device_count() == 0:
            problems.append("NVML reports no GPUs")
        backend.close()
    try:
        identity = Identity(cfg.state_dir)
        spool = Spool(cfg.state_dir, max_bytes=cfg.spool_max_bytes)
        print(
            f"spool: {cfg.state_dir} depth={spool.depth} bytes={spool.bytes} "
            f"dropped={spool.dropped} agent_id={identity.agent_id} next_seq={identity.next_seq}"
        )
        spool.close()
    except OSError as exc:
        problems.append(f"state dir {cfg.state_dir}: {exc.strerror}")
    for engine in cfg.serving:
        scraper = EngineScraper(engine)
        scraper.poll(0.0)
        if scraper.problem:
            problems.append(f"serving {engine.worker} ({engine.url}): {scraper.problem}")
        else:
            where = f"{engine.group}/{engine.worker}"
            print(f"serving: {engine.engine} at {engine.url} readable as {where}")
    if cfg.server:
        url = cfg.server.rstrip("/") + "/api/v1/agents/actions"
        request = urllib.request.Request(  # noqa: S310 -- server URL comes from config
            url, headers={"Authorization": f"Bearer {cfg.token}"}
        )
        try:
            with opener_for(cfg.server).open(request, timeout=5) as response:
                print(f"server: {cfg.server} reachable (HTTP {response.status})")
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                problems.append(f"server {cfg.server} refused the token (HTTP {exc.code})")
            else:
                print(f"server: {cfg.server} reachable (HTTP {exc.code})")
        except OSError as exc:
            problems.append(f"server {cfg.server} unreachable: {exc}")
    elif not cfg.dry_run:
        problems.append("no server configured")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "version":
        print(f"faultline-agent {__version__}")
        return 0
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        cfg = build_config(args)
    except ConfigError as exc:
        print(f"faultline-agent: {exc}", file=sys.stderr)
        return 2
    if args.command == "check":
        return check(cfg)
    agent = Agent(cfg)
    print(json.dumps({"agent": "started", **agent.status(), "node": cfg.node}), file=sys.stderr)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
