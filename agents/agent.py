"""The node agent process: wires collectors, spool, sender, listener, watcher and executor.

Owns the agent's lifecycle and the sampling tick (heartbeat + one device_sample per GPU per
interval). It must not contain collection, spooling or HTTP logic itself — those live in
their own modules — and it imports only the standard library and this package.
SIGTERM/SIGINT: stop collecting, flush what the server will take, persist, exit 0.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agents import __version__, xid
from agents.checkpoints import CheckpointWatcher, RootConfig
from agents.evidence import Evidence
from agents.executor import Executor
from agents.fake_host import FakeHost
from agents.fake_nvml import FakeNvml, parse_scripts
from agents.host import HostMonitor, HostPaths
from agents.kmsg import KernelLog
from agents.listener import Listener
from agents.nvml import GpuBackend, load_backend
from agents.replay import DEFAULT_MAX_BYTES as REPLAY_MAX_BYTES
from agents.replay import DEFAULT_WINDOW_S
from agents.schedulers import Attestation, backend_named
from agents.sender import AgentInfo, AuthError, Sender
from agents.serving_scrape import EngineConfig, ServingScraper
from agents.spool import DEFAULT_MAX_BYTES, SAMPLE_KINDS, Identity, Spool
from agents.wire import Record, record

log = logging.getLogger("faultline.agent")

DEFAULT_STATE_DIR = "/var/lib/faultline-agent"


@dataclass
class Config:
    server: str = ""
    token: str = ""
    node: str = field(default_factory=socket.gethostname)
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    interval: float = 1.0
    # How often a batch goes out (None: every sampling interval); events still go within
    # ~50 ms. Large fleets send every few seconds: the service's cost is mostly per batch
    # (docs/operations.md).
    send_interval: float | None = None
    fake_gpus: int = 0
    fake_scripts: list[str] = field(default_factory=list)
    dcgm_url: str | None = None
    checkpoint_roots: list[RootConfig] = field(default_factory=list)
    dry_run: bool = False
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    # Acknowledged batches are kept this long to re-send what a database failover lost
    # (agents/replay.py): at least the deployment's replication-lag bound; 0 keeps none.
    replay_window_s: float = DEFAULT_WINDOW_S
    replay_max_bytes: int = REPLAY_MAX_BYTES
    reporter_socket: str | None = None
    reporter_udp_port: int | None = None
    reporter_socket_mode: int = 0o660
    hooks: dict[str, str] = field(default_factory=dict)
    # The node's own limits on actions (agents/executor.py): None = the kinds with a hook;
    # GPUs an action may name (empty: the GPUs the backend reports); unsigned actions only
    # while the service does not sign yet (a migration switch, off by default).
    allowed_kinds: list[str] | None = None
    gpus: list[str] = field(default_factory=list)
    allow_unsigned: bool = False
    scheduler: str | None = None  # built-in backend: "slurm" | "kubernetes" (agents/schedulers)
    # The scheduler's controller agent (docs/agent.md, "Controller agent"): it also runs
    # the node actions whose spec says `controller` for other nodes whose own agent is silent,
    # for the node names these globs allow.
    controller: bool = False
    controller_nodes: list[str] = field(default_factory=lambda: ["*"])
    hook_timeout_s: float = 60.0
    action_poll_s: float = 15.0
    verify_rate_mb_s: float = 100.0
    max_batch_records: int = 1000
    # [xid_overrides] of agent.toml: code -> {class, action, investigatory} (agents/xid.py)
    xid_catalog: xid.XidCatalog | None = None
    # Host, network and kernel evidence (docs/agent.md): read every host_interval seconds.
    host_evidence: bool = True
    host_interval: float = 5.0
    kmsg_path: str = "/dev/kmsg"
    sys_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    # The network view when it is not the agent's own namespace (docs/agent.md [host]).
    net_sys_root: Path | None = None
    net_dir: Path | None = None
    net_ns: Path | None = None
    interfaces: list[str] = field(default_factory=list)
    # The boot id the agent reports (None: the kernel's). A test or the demo simulates a
    # reboot by restarting the agent with a new one (the service's repair evidence).
    boot_id: str | None = None
    # [[serving]]: vLLM/SGLang engines on this node whose metrics become serving windows.
    serving: list[EngineConfig] = field(default_factory=list)


def boot_id() -> str | None:
    """The kernel's boot id (changes on every reboot), or None where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:64] or None
    except OSError:
        return None


def make_backend(config: Config, out: IO[str]) -> GpuBackend | None:
    if config.fake_gpus > 0:
        return FakeNvml(config.node, config.fake_gpus, scripts=parse_scripts(config.fake_scripts))
    if config.dcgm_url:
        from agents.dcgm import DcgmBackend

        return DcgmBackend(config.dcgm_url)
    return load_backend(out)


class Agent:
    def __init__(
        self, config: Config, *, backend: GpuBackend | None = None, out: IO[str] | None = None
    ) -> None:
        self.config = config
        self.out = out or sys.stdout
        if config.xid_catalog is not None:
            xid.install(config.xid_catalog)  # before the backend reads any Xid
        state = Path(config.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        self.identity = Identity(state)
        self.spool = Spool(
            state,
            max_bytes=config.spool_max_bytes,
            replay_window_s=config.replay_window_s,
            replay_max_bytes=config.replay_max_bytes,
        )
        self.backend = backend if backend is not None else make_backend(config, self.out)
        self.info = AgentInfo(
            self.identity.agent_id,
            config.node,
            __version__,
            (config.boot_id or "")[:64] or boot_id(),
        )
        self.executor = Executor(
            state,
            node=config.node,
            hooks=config.hooks,
            server=config.server,
            token=config.token,
            dry_run=config.dry_run,
            timeout_s=config.hook_timeout_s,
            allowed_kinds=config.allowed_kinds,
            gpus=self.own_gpus,
            allow_unsigned=config.allow_unsigned,
            scheduler=config.scheduler,
            controller_nodes=config.controller_nodes if config.controller else (),
        )
        self.sender = Sender(
            self.spool,
            self.identity,
            self.info,
            server=config.server or "http://127.0.0.1",
            token=config.token,
            state_dir=state,
            interval=config.send_interval or config.interval,
            max_records=config.max_batch_records,
            dry_run=config.dry_run,
            on_actions=self.executor.submit,
            out=self.out,
        )
        self.listener = Listener(
            self.enqueue,
            socket_path=config.reporter_socket or str(state / "reporter.sock"),
            udp_port=config.reporter_udp_port,
            mode=config.reporter_socket_mode,
        )
        self.watcher = (
            CheckpointWatcher(
                config.checkpoint_roots,
                self.enqueue,
                state_dir=state,
                interval_s=max(config.interval, 1.0),
                verify_rate_bytes=int(config.verify_rate_mb_s * 1024 * 1024),
            )
            if config.checkpoint_roots
            else None
        )
        # The jobs running here, attested on every heartbeat (docs/security.md, "Who owns a
        # group"): only with a scheduler to ask.
        scheduler = backend_named(config.scheduler)
        self.attestation = Attestation(scheduler, config.node) if scheduler else None
        self.evidence = Evidence(self.enqueue, pci_to_gpu=self._pci_to_gpu)
        self.serving = ServingScraper(config.serving, self.enqueue)
        self.fake_host: FakeHost | None = None
        self.host: HostMonitor | None = None
        self.kernel_log: KernelLog | None = None
        roots = [r.path for r in config.checkpoint_roots]

        def paths(sys_root: Path, proc_root: Path, ckpt: list[Path]) -> HostPaths:
            return HostPaths(
                sys_root,
                proc_root,
                ckpt,
                net_sys_root=config.net_sys_root,
                net_dir=config.net_dir,
                interfaces=tuple(config.interfaces),
                net_ns=config.net_ns,
            )

        # A configured network view is real even beside fake GPUs (the drill's namespaces).
        self.net: HostMonitor | None = None
        if config.host_evidence and config.fake_gpus > 0:
            self.fake_host = FakeHost(config.node)
            self.host = self.fake_host.monitor(roots)
            if config.net_sys_root or config.net_dir or config.net_ns:
                self.net = HostMonitor(paths(config.sys_root, config.proc_root, []))
        elif config.host_evidence:
            self.host = HostMonitor(
                paths(config.sys_root, config.proc_root, roots),
                io_errors=self.evidence.io_errors_of,
            )
            self.kernel_log = KernelLog(self.evidence.kernel_sink, path=config.kmsg_path)
        self._host_every = max(1, round(config.host_interval / max(config.interval, 1e-3)))
        self._ticks = 0
        self.started = time.monotonic()
        self.stop_event = threading.Event()
        self.error: str | None = None

    def _pci_to_gpu(self) -> dict[str, str]:
        """PCI bus id -> GPU UUID, for kernel-log lines that name a GPU by its address."""
        backend = self.backend
        read = getattr(backend, "pci_bus_id", None)
        if backend is None or read is None:
            return {}
        out = {}
        for index in range(backend.device_count()):
            bus = read(index)
            if bus:
                out[bus] = backend.uuid(index)
        return out

    def host_round(self) -> None:
        """Host, network and storage readings (every host_interval)."""
        if self.host is None:
            return
        if self.fake_host is not None:
            self.fake_host.poll_control()
        try:
            for rec in self.host.round():
                self.enqueue(rec)
            net = [*self.net.net_records(), *self.net.peer_records()] if self.net else []
            for rec in net:
                self.enqueue(rec)
        except Exception:
            log.exception("host evidence: read failed")

    def own_gpus(self) -> set[str]:
        """The GPUs an action may target: configured, else what the backend reports."""
        if self.config.gpus:
            return set(self.config.gpus)
        if self.backend is None:
            return set()
        try:
            return {self.backend.uuid(i) for i in range(self.backend.device_count())}
        except Exception:
            log.exception("could not list this node's GPUs; GPU actions are refused")
            return set()

    def enqueue(self, rec: Record) -> None:
        job = rec.get("job")
        if job and self.attestation is not None and self.attestation.wants(str(job)):
            # A job that just started here: attest it before its first record goes out,
            # or the service refuses the record as a stranger's.
            self.spool.append(self._heartbeat(), in_order=True)
        self.spool.append(rec)
        if rec.get("kind") not in SAMPLE_KINDS:
            # Fencing needs the newest generation per group; workload records carry it.
            self.executor.observe(rec.get("group"), rec.get("generation"))
            if self.watcher is not None and "rank" in rec:
                # Which ranks run here decides who reports a shared checkpoint root.
                self.watcher.saw(rec.get("group"), rec.get("generation"), rec.get("rank"))
            self.sender.wake()

    def _heartbeat(self) -> Record:
        return record(
            "heartbeat",
            uptime_s=round(time.monotonic() - self.started, 3),
            spool_depth=self.spool.depth,
            dropped=self.spool.dropped,
            jobs=None if self.attestation is None else self.attestation.jobs,
        )

    def tick(self) -> None:
        """One sampling round: a heartbeat and a device_sample per GPU."""
        self.enqueue(self._heartbeat())
        if self.backend is not None:
            for index in range(self.backend.device_count()):
                try:
                    self.enqueue(self.backend.sample(index))
                except Exception:
                    log.exception("GPU %d: sample failed", index)
        if self._ticks % self._host_every == 0:
            self.host_round()
        elif (peers := self.net or (None if self.fake_host else self.host)) is not None:
            with contextlib.suppress(Exception):  # evidence never stops the agent
                peers.sample_peers()
        self._ticks += 1
        self.spool.sync()

    def _send_loop(self) -> None:
        try:
            self.sender.run(self.stop_event)
        except AuthError as exc:
            self.error = str(exc)
            self.stop_event.set()
        except Exception as exc:
            log.exception("sender crashed")
            self.error = f"sender crashed: {exc}"
            self.stop_event.set()

    def start(self) -> list[threading.Thread]:
        if self.backend is not None:
            self.backend.start_events(self.evidence.device_sink)
        if self.fake_host is not None:
            self.fake_host.start_kernel_log(self.evidence.kernel_sink)
        if self.kernel_log is not None:
            self.kernel_log.start()
        threads: list[threading.Thread] = []
        if self.attestation is not None:
            self.attestation.refresh()  # before the first heartbeat and the first record
            attest = threading.Thread(
                target=self.attestation.run, args=(self.stop_event,), name="attest", daemon=True
            )
            attest.start()
            threads.append(attest)
        self.listener.start()
        self.executor.start(poll_s=self.config.action_poll_s if self.config.server else 0)
        if self.watcher is not None:
            self.watcher.start()
        self.serving.start()
        sender = threading.Thread(target=self._send_loop, name="sender", daemon=True)
        sender.start()
        return [sender, *threads]

    def run(self, *, install_signals: bool = True, max_ticks: int | None = None) -> int:
        """Run until SIGTERM/SIGINT (or `max_ticks`); returns the process exit code."""
        # A short GIL switch interval keeps the reporter socket's receive thread responsive
        # while the sender serialises a large batch (the kernel queues few datagrams).
        sys.setswitchinterval(0.001)
        if install_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.stop_event.set())
        threads = self.start()
        ticks = 0
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            self.tick()
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
            next_at += self.config.interval
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))
        return self.shutdown(threads)

    def shutdown(self, threads: list[threading.Thread] | None = None) -> int:
        self.stop_event.set()
        self.sender.stop()
        for thread in threads or []:
            thread.join(timeout=self.sender.timeout + 1)
        self.listener.stop()
        self.serving.stop()
        if self.watcher is not None:
            self.watcher.stop()
        if self.kernel_log is not None:
            self.kernel_log.stop()
        if self.fake_host is not None:
            self.fake_host.close()
        self.executor.stop()
        if self.backend is not None:
            self.backend.close()
        if self.error is None:
            try:
                self.sender.flush(deadline_s=min(5.0, self.config.interval * 5))
            except AuthError as exc:
                self.error = str(exc)
        self.sender.close()
        self.spool.close()
        if self.error:
            print(f"faultline-agent: {self.error}", file=sys.stderr, flush=True)
            return 2
        return 0

    def status(self) -> dict[str, Any]:
        return {
            "agent_id": self.identity.agent_id,
            "next_seq": self.identity.next_seq,
            "spool_depth": self.spool.depth,
            "spool_bytes": self.spool.bytes,
            "dropped": self.spool.dropped,
        }
