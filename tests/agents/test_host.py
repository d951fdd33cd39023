"""Host, network and storage readers against fixture trees; the evidence fold; the fake host."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agents import kmsg
from agents.agent import Agent, Config
from agents.evidence import Evidence
from agents.fake_host import FakeHost
from agents.fake_nvml import FakeNvml
from agents.host import (
    HostMonitor,
    HostPaths,
    count_d_state,
    mount_device,
    read_eth_ports,
    read_ib_ports,
    read_psi,
    read_swap,
)
from agents.protocol import decode_batch

from .conftest import validate

FIXTURES = Path(__file__).parent / "fixtures"


def _tree(root: Path, *, ib: bool = True) -> HostPaths:
    """A small /sys and /proc: one HCA port, eth0, lo, PSI, meminfo, three tasks."""
    sys_, proc = root / "sys", root / "proc"
    if ib:
        port = sys_ / "class/infiniband/mlx5_0/ports/1"
        (port / "counters").mkdir(parents=True)
        for name, value in (("symbol_error", 10), ("link_downed", 2), ("port_rcv_errors", 0),
                            ("port_xmit_discards", 5), ("port_xmit_wait", 1000)):  # fmt: skip
            (port / "counters" / name).write_text(f"{value}\n")
        (port / "state").write_text("4: ACTIVE\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    for iface, physical in (("eth0", True), ("lo", False), ("veth1a2b", True)):
        n = sys_ / "class/net" / iface
        (n / "statistics").mkdir(parents=True)
        if physical:
            (n / "device").mkdir()
        (n / "statistics/rx_errors").write_text("3\n")
        (n / "statistics/tx_dropped").write_text("0\n")
        (n / "carrier_changes").write_text("2\n")
        (n / "operstate").write_text("up\n")
        (n / "speed").write_text("100000\n")
    (proc / "pressure").mkdir(parents=True)
    (proc / "pressure/memory").write_text(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n"
        "full avg10=3.10 avg60=1.00 avg300=0.50 total=45\n"
    )
    (proc / "pressure/io").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        "full avg10=40.00 avg60=0 avg300=0 total=9\n"
    )
    (proc / "meminfo").write_text("MemTotal: 100 kB\nSwapTotal:  2048 kB\nSwapFree:   1024 kB\n")
    for pid, comm, state in ((1, "systemd", "S"), (77, "python) D x", "D"), (78, "kworker", "D"),
                             (79, "python", "R")):  # fmt: skip
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} 1 1 1 0 -1\n")
    (proc / "mounts").write_text(
        "/dev/nvme0n1p2 / ext4 rw 0 0\n/dev/nvme1n1 /ckpt xfs rw 0 0\n"
        "server:/x /ckpt/nfs nfs4 rw 0 0\n"
    )
    return HostPaths(sys_, proc, [Path("/ckpt")])


def _bump(paths: HostPaths, rel: str, value: str) -> None:
    (paths.sys_root / rel).write_text(value)


# -- readers --------------------------------------------------------------------------


def test_it_reads_ib_ports_their_state_rate_and_counters(tmp_path: Path) -> None:
    paths = _tree(tmp_path)
    (port,) = read_ib_ports(paths.sys_root) or []
    assert (port.port, port.link, port.state, port.rate_gbps) == ("mlx5_0/1", "ib", "ACTIVE", 400)
    assert port.counters == {"symbol_error": 10, "link_downed": 2, "port_rcv_errors": 0,
                             "port_xmit_discards": 5, "port_xmit_wait": 1000}  # fmt: skip


def test_it_reads_only_physical_ethernet_interfaces(tmp_path: Path) -> None:
    paths = _tree(tmp_path)
    (eth,) = read_eth_ports(paths.sys_root)
    assert (eth.port, eth.state, eth.rate_gbps) == ("eth0", "up", 100.0)
    assert eth.counters == {"rx_errors": 3, "tx_dropped": 0, "carrier_changes": 2}


def test_it_reads_psi_swap_d_state_and_the_checkpoint_disk(tmp_path: Path) -> None:
    paths = _tree(tmp_path)
    assert read_psi(paths.proc_root, "memory") == {"some": 12.5, "full": 3.1}
    assert read_swap(paths.proc_root) == (1024 * 1024, 2048 * 1024)
    assert count_d_state(paths.proc_root) == 2  # a ") D" inside the comm is not a state
    assert mount_device("/ckpt", paths.proc_root) == "nvme1n1"
    assert mount_device("/ckpt/nfs/run1", paths.proc_root) == "x"  # the longest mount wins
    assert mount_device("/ckpt/run1", paths.proc_root) == "nvme1n1"


def test_it_reports_the_host_sample_within_the_contract(tmp_path: Path) -> None:
    monitor = HostMonitor(_tree(tmp_path), statvfs=lambda root: (5, 100),
                          io_errors=lambda dev: 3 if dev == "nvme1n1" else 0)  # fmt: skip
    rec = monitor.host_record()
    assert rec["disks"] == [{"root": "/ckpt", "device": "nvme1n1", "io_errors": 3,
                             "free_bytes": 5, "total_bytes": 100}]  # fmt: skip
    assert (rec["io_full_avg10"], rec["d_state"], rec["swap_used_bytes"]) == (40.0, 2, 1048576)
    validate([rec])


# -- the monitor: deltas and events ---------------------------------------------------


def test_it_sends_counter_deltas_after_a_baseline_round(tmp_path: Path) -> None:
    paths = _tree(tmp_path)
    monitor = HostMonitor(paths)
    assert monitor.net_records() == []  # the first read is the baseline
    _bump(paths, "class/infiniband/mlx5_0/ports/1/counters/symbol_error", "25\n")
    recs = monitor.net_records()
    ib = next(r for r in recs if r["kind"] == "net_sample" and r["port"] == "mlx5_0/1")
    assert ib["counters"] == {"symbol_error": 15, "link_downed": 0, "port_rcv_errors": 0,
                              "port_xmit_discards": 0, "port_xmit_wait": 0}  # fmt: skip
    (event,) = [r for r in recs if r["kind"] == "net_event"]
    assert (event["event"], event["counters"]) == ("errors", {"symbol_error": 15})
    validate(recs)


def test_it_calls_a_link_downed_step_a_flap_and_a_state_change_down_then_up(
    tmp_path: Path,
) -> None:
    paths = _tree(tmp_path)
    monitor = HostMonitor(paths)
    monitor.net_records()
    _bump(paths, "class/infiniband/mlx5_0/ports/1/counters/link_downed", "3\n")
    assert [(r["event"], r["counters"]) for r in monitor.net_records()
            if r["kind"] == "net_event"] == [("link_down", {"link_downed": 1})]  # fmt: skip
    _bump(paths, "class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n")
    assert [r["event"] for r in monitor.net_records() if r["kind"] == "net_event"] == ["link_down"]
    _bump(paths, "class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n")
    assert [r["event"] for r in monitor.net_records() if r["kind"] == "net_event"] == ["link_up"]


def test_it_calls_a_lower_rate_a_rate_drop(tmp_path: Path) -> None:
    paths = _tree(tmp_path)
    monitor = HostMonitor(paths)
    monitor.net_records()
    _bump(paths, "class/infiniband/mlx5_0/ports/1/rate", "200 Gb/sec (2X NDR)\n")
    (ev,) = [r for r in monitor.net_records() if r["kind"] == "net_event"]
    assert (ev["event"], ev["rate_gbps"], ev["prev_rate_gbps"]) == ("rate_drop", 200.0, 400.0)


def test_it_says_once_that_the_host_has_no_infiniband_and_reads_ethernet(
    tmp_path: Path, caplog
) -> None:
    monitor = HostMonitor(_tree(tmp_path, ib=False))
    with caplog.at_level(logging.INFO, logger="faultline.agent.host"):
        for _ in range(3):
            recs = monitor.round()
    assert [r.getMessage() for r in caplog.records if "InfiniBand" in r.getMessage()] == [
        f"no InfiniBand on this host ({tmp_path / 'sys/class/infiniband'}): reading Ethernet only"
    ]
    assert monitor.has_ib is False
    assert [r["port"] for r in recs if r["kind"] == "net_sample"] == ["eth0"]


# -- one Xid event from two sources -----------------------------------------------------


def _xid(gpu: str, ts: datetime) -> dict:
    return {"kind": "device_event", "ts": ts.isoformat(), "gpu": gpu, "event": "xid", "code": 79}


def test_it_sends_an_xid_seen_by_nvml_and_the_kernel_log_once_in_either_order() -> None:
    t0 = datetime(2026, 12, 1, 10, tzinfo=UTC)
    line = kmsg.KernelEvent("xid", t0 + timedelta(seconds=0.3), device="0000:3b:00", code=79)
    for order in ("nvml_first", "kernel_first"):
        sent: list[dict] = []
        ev = Evidence(sent.append, pci_to_gpu=lambda: {"00000000:3B:00.0": "GPU-a"})
        if order == "nvml_first":
            ev.device_sink(_xid("GPU-a", t0))
            ev.kernel_sink(line)
        else:
            ev.kernel_sink(line)
            ev.device_sink(_xid("GPU-a", t0))
        assert [(r["gpu"], r["code"]) for r in sent] == [("GPU-a", 79)], order
        assert ev.xids.sources("GPU-a", 79) == {"nvml", "kmsg"}
        validate(sent)


def test_it_sends_a_recurring_xid_after_the_window_and_keeps_an_unmapped_gpu() -> None:
    t0 = datetime(2026, 12, 1, 10, tzinfo=UTC)
    sent: list[dict] = []
    ev = Evidence(sent.append)
    ev.kernel_sink(kmsg.KernelEvent("xid", t0, device="0000:3b:00", code=13))
    ev.kernel_sink(kmsg.KernelEvent("gpu_off_bus", t0, device="0000:3b:00"))  # not an Xid
    ev.kernel_sink(kmsg.KernelEvent("xid", t0 + timedelta(seconds=60), device="0000:3b:00",
                                    code=13))  # fmt: skip
    assert [(r["gpu"], r["event"], r.get("code")) for r in sent] == [
        ("PCI:0000:3b:00", "xid", 13), ("PCI:0000:3b:00", "gpu_lost", None),
        ("PCI:0000:3b:00", "xid", 13)]  # fmt: skip


def test_it_folds_repeated_host_lines_and_counts_io_errors_per_disk() -> None:
    t0 = datetime(2026, 12, 1, 10, tzinfo=UTC)
    sent: list[dict] = []
    ev = Evidence(sent.append)
    for dt in (0.0, 0.1, 9.0):
        ev.kernel_sink(kmsg.KernelEvent("mce", t0 + timedelta(seconds=dt)))
    for _ in range(3):
        ev.kernel_sink(kmsg.KernelEvent("io_error", t0, device="nvme1n1"))
    assert [r["event"] for r in sent] == ["mce", "mce", "io_error"]
    assert ev.io_errors_of("nvme1n1p1") == 3 and ev.io_errors_of("sda") == 0
    validate(sent)


# -- contract and fake host ------------------------------------------------------------


def test_it_decodes_the_golden_host_records() -> None:
    body = (FIXTURES / "contract" / "host_records.json").read_bytes()
    batch = decode_batch(body)
    kinds = [type(r).__struct_config__.tag for r in batch.records]
    assert kinds.count("host_event") == 6 and kinds.count("net_event") == 2
    assert {"net_sample", "host_sample", "device_event"} <= set(kinds)


def test_it_refuses_free_text_in_a_host_event() -> None:
    rec = {"kind": "host_event", "ts": "2026-12-01T10:00:00Z", "event": "oom_kill",
           "comm": "python", "message": "Out of memory: Killed process 1"}  # fmt: skip
    try:
        validate([rec])
    except ValueError as exc:
        assert "message" in str(exc)
    else:
        raise AssertionError("a host_event with a message field was accepted")


def test_it_plays_a_fake_hca_and_kernel_log_from_its_control_file(tmp_path: Path) -> None:
    control = tmp_path / "node-1"
    host = FakeHost("node-1", root=tmp_path / "tree", control=control)
    events: list[kmsg.KernelEvent] = []
    host.start_kernel_log(events.append)
    monitor = host.monitor()
    monitor.round()
    control.write_text("link_flap@mlx5_1/1\nbogus\noom:555\nxid:2:79\ndisk_full\n")
    assert host.poll_control() == 4
    recs = monitor.round()
    (flap,) = [r for r in recs if r["kind"] == "net_event"]
    assert (flap["port"], flap["event"], flap["counters"]["link_downed"]) == (
        "mlx5_1/1", "link_down", 1)  # fmt: skip
    assert [(e.event, e.pid, e.device, e.code) for e in events] == [
        ("oom_kill", 555, None, None), ("xid", 2817, "0000:38:00", 79)]  # fmt: skip
    host_rec = recs[-1]
    assert host_rec["disks"][0]["free_bytes"] == 0 and host_rec["disks"][0]["device"] == "nvme1n1"
    validate(recs)
    json.dumps(recs)


def test_it_sends_one_event_when_the_fake_gpu_and_fake_kernel_log_report_one_xid(
    short_dir: Path,
) -> None:
    control = short_dir / "ctl"
    control.mkdir()
    cfg = Config(node="node-1", state_dir=short_dir / "s", fake_gpus=4, dry_run=True,
                 action_poll_s=0)  # fmt: skip
    agent = Agent(cfg, backend=FakeNvml("node-1", 4))
    assert agent.fake_host is not None
    sent: list[dict] = []
    agent.evidence.emit = sent.append
    agent.backend.start_events(agent.evidence.device_sink)  # type: ignore[union-attr]  # set above
    agent.fake_host.start_kernel_log(agent.evidence.kernel_sink)
    agent.backend.script(2, "xid79")  # type: ignore[union-attr]  # FakeNvml
    agent.fake_host.script("xid", "2:79")
    xids = [r for r in sent if r.get("event") == "xid"]
    assert [(r["gpu"], r["code"]) for r in xids] == [(agent.backend.uuid(2), 79)]  # type: ignore[union-attr]  # FakeNvml
    agent.spool.close()
    agent.fake_host.close()


def test_it_puts_every_checkpoint_root_of_the_fake_host_on_its_fake_nvme_disk(
    tmp_path: Path,
) -> None:
    host = FakeHost("node-1", root=tmp_path / "tree")
    rec = host.monitor([tmp_path / "ckpt-a", Path("/ckpt")]).host_record()
    assert [(d["root"], d["device"]) for d in rec["disks"]] == [
        (str(tmp_path / "ckpt-a"), "nvme1n1"), ("/ckpt", "nvme1n1")]  # fmt: skip
