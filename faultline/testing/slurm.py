"""A real one-node Slurm cluster (munged + slurmctld + slurmd) in a temp dir, for tests.

Owns starting and tearing down the daemons: a generated `slurm.conf` naming this host as
the only node, a fresh munge key and socket, state/spool/log dirs under the temp dir, and
free ports. Clients reach it through `SLURM_CONF` (see `Slurm.env`). It must not touch
the host's `/etc/slurm` or `/etc/munge` and must not leave a process behind.
`slurm_available()` says why a test skips when the Debian packages are absent.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "squeue")
SBIN = ("/usr/sbin", "/sbin")


def _which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN:
        candidate = Path(folder) / name
        if candidate.exists():
            return str(candidate)
    return None


def _need(name: str) -> str:
    found = _which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed")
    return found


def slurm_available() -> str:
    """'' when a real Slurm can be started here, else the reason it cannot."""
    missing = [name for name in BINARIES if _which(name) is None]
    if missing:
        return (
            f"Slurm/munge binaries missing ({', '.join(missing)}): "
            "apt-get install slurm-wlm munge (.ci/run does)"
        )
    if os.geteuid() != 0:
        return "a real slurmd needs root (SlurmUser=root, munged as user munge)"
    return ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Slurm:
    """A running cluster: its node name, config path, the env clients need, the daemons."""

    root: Path
    node: str
    conf: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def run(self, *argv: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-n", self.node, "-o", "%T").stdout.strip()

    def logs(self) -> str:
        parts = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def _conf(root: Path, node: str, cpus: int, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=faultline-test
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=2
Waittime=0
SchedulerParameters=defer_batch=0
JobRequeue=1
NodeName={node} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _wait(
    check: Callable[[], object], timeout: float, what: str, slurm: Slurm | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    detail = slurm.logs() if slurm else ""
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}\n{detail}")


def start_slurm(*, timeout: float = 60) -> Slurm:
    """Start munged, slurmctld and slurmd on this host; returns once the node is idle."""
    reason = slurm_available()
    if reason:
        raise RuntimeError(reason)
    # Short path: the munge socket path must stay under the 108-byte sun_path limit.
    root = Path(tempfile.mkdtemp(prefix="fl-slurm-"))
    node = socket.gethostname().split(".")[0]
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir()
    os.chmod(root, 0o755)  # noqa: S103 -- munged (user munge) must traverse the root
    munge_dir = root / "munge"
    key = munge_dir / "munge.key"
    subprocess.run([_need("mungekey"), "-c", "-f", "-k", str(key)], check=True)
    shutil.chown(munge_dir, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    os.chmod(munge_dir, 0o700)
    os.chmod(key, 0o600)
    log_munge = root / "log" / "munged.log"
    log_munge.touch()
    shutil.chown(log_munge, "munge", "munge")
    conf = root / "slurm.conf"
    cpus = max(os.cpu_count() or 1, 1)
    conf.write_text(_conf(root, node, cpus, _free_port(), _free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    env["PATH"] = env.get("PATH", "") + ":" + ":".join(SBIN)
    slurm = Slurm(root=root, node=node, conf=conf, env=env)
    try:
        munge_cmd = [
            _which("munged"),
            "--foreground",
            "--force",
            f"--socket={munge_dir}/munge.socket",
            f"--key-file={key}",
            f"--log-file={log_munge}",
            f"--pid-file={munge_dir}/munged.pid",
            f"--seed-file={munge_dir}/munged.seed",
        ]
        slurm.procs["munged"] = _spawn(
            ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups", *munge_cmd], env
        )
        _wait(lambda: (munge_dir / "munge.socket").exists(), 15, "munged's socket", slurm)
        slurm.procs["slurmctld"] = _spawn([_which("slurmctld"), "-D", "-i", "-f", str(conf)], env)
        _wait(lambda: slurm.run("scontrol", "ping").returncode == 0, timeout, "slurmctld", slurm)
        slurm.procs["slurmd"] = _spawn([_which("slurmd"), "-D", "-f", str(conf)], env)
        _wait(lambda: slurm.node_state() == "idle", timeout, f"node {node} idle", slurm)
    except BaseException:
        stop_slurm(slurm)
        raise
    return slurm


def _spawn(argv: list[str | None], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(a) for a in argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop_slurm(slurm: Slurm) -> None:
    """Cancel jobs, stop the daemons this harness started (by pid), remove the temp dir."""
    if "slurmctld" in slurm.procs:
        slurm.run("scancel", "--full", "--quiet", f"--nodelist={slurm.node}", timeout=10)
    for name in ("slurmd", "slurmctld", "munged"):
        proc = slurm.procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    shutil.rmtree(slurm.root, ignore_errors=True)


def slurm_cluster() -> Iterator[Slurm]:
    """Generator body for a pytest fixture: `yield from slurm_cluster()`."""
    slurm = start_slurm()
    try:
        yield slurm
    finally:
        stop_slurm(slurm)
