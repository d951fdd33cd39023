"""Port byte counters and their span: what the console's per-node network throughput is
made of (InfiniBand data counters in 4-octet words, Ethernet's in bytes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.fake_host import IB_PORTS, FakeHost
from agents.host import HostMonitor, HostPaths, PortReading, read_eth_ports, read_ib_ports

from .conftest import validate


def _sys(root: Path) -> Path:
    port = root / "class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "counters/port_xmit_data").write_text("1000\n")  # 4-octet words
    (port / "counters/port_rcv_data").write_text("250\n")
    (port / "state").write_text("4: ACTIVE\n")
    eth = root / "class/net/eth0"
    (eth / "statistics").mkdir(parents=True)
    (eth / "device").mkdir()
    (eth / "statistics/tx_bytes").write_text("7000\n")
    (eth / "statistics/rx_bytes").write_text("9000\n")
    (eth / "operstate").write_text("up\n")
    return root


def test_it_reads_ib_data_counters_as_bytes_and_ethernet_bytes_as_they_are(tmp_path) -> None:
    root = _sys(tmp_path)
    (ib,) = read_ib_ports(root) or []
    assert (ib.counters["tx_bytes"], ib.counters["rx_bytes"]) == (4000, 1000)
    assert "port_xmit_data" not in ib.counters  # one name for bytes, whatever the link
    (eth,) = read_eth_ports(root)
    assert (eth.counters["tx_bytes"], eth.counters["rx_bytes"]) == (7000, 9000)


def _reading(port: str, tx: int, at: float) -> PortReading:
    return PortReading(port, "ib", "ACTIVE", 400.0, {"tx_bytes": tx}, read_at=at)


@pytest.mark.parametrize("span", [0.5, 2.0, 5.0])
def test_it_sends_each_delta_with_the_span_it_covers(span: float) -> None:
    monitor = HostMonitor(HostPaths(Path("/nonexistent"), Path("/nonexistent"), []))
    assert monitor.net_records([_reading("mlx5_0/1", 0, 100.0)]) == []  # the baseline
    (rec,) = monitor.net_records([_reading("mlx5_0/1", 10_000, 100.0 + span)])
    assert rec["counters"] == {"tx_bytes": 10_000} and rec["interval_s"] == span
    validate([rec])


def test_it_leaves_out_a_span_too_short_to_divide_by() -> None:
    monitor = HostMonitor(HostPaths(Path("/nonexistent"), Path("/nonexistent"), []))
    monitor.net_records([_reading("mlx5_0/1", 0, 100.0)])
    (rec,) = monitor.net_records([_reading("mlx5_0/1", 10, 100.0)])  # the same instant
    assert "interval_s" not in rec
    validate([rec])


def test_the_fake_host_carries_traffic_on_its_ib_ports(tmp_path: Path) -> None:
    host = FakeHost("node-9", root=tmp_path)
    monitor = host.monitor()
    host.poll_control()
    monitor.net_records()  # the baseline
    host.poll_control()
    recs = [r for r in monitor.net_records() if r["kind"] == "net_sample" and r["link"] == "ib"]
    assert {r["port"] for r in recs} == set(IB_PORTS)
    for r in recs:
        assert r["counters"]["tx_bytes"] > 0 and r["counters"]["rx_bytes"] > 0
    validate(recs)
