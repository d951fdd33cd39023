# ruff: noqa: E501 - /proc fixture lines are as wide as the kernel writes them
"""The agent's view of a node's network from another namespace: named interfaces, the
TCP MIB and the per-peer socket table (agents/host.py)."""

from __future__ import annotations

from pathlib import Path

from agents.host import HostMonitor, HostPaths, read_eth_ports, read_tcp, read_tcp_peers

SNMP = """Ip: Forwarding DefaultTTL
Ip: 1 64
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 10 10 0 0 4 {ins} {outs} {retrans} 0 0 0
"""
# 10.213.7.2 -> .1 established with 0x1f4 bytes queued and a retransmit timer; -> .3 idle;
# a loopback socket and a listening one, both left out.
TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0207D50A:9C40 0107D50A:8AE2 01 000001F4:00000000 01:00000014 00000002     0        0 1
   1: 0207D50A:9C41 0307D50A:8AE3 01 00000000:00000000 00:00000000 00000000     0        0 2
   2: 0100007F:0CEA 0100007F:D431 01 00000010:00000000 00:00000000 00000000     0        0 3
   3: 00000000:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4
"""


def _net(tmp: Path, retrans: int = 3, outs: int = 100) -> Path:
    net = tmp / "net"
    net.mkdir(exist_ok=True)
    (net / "snmp").write_text(SNMP.format(ins=90, outs=outs, retrans=retrans))
    (net / "tcp").write_text(TCP)
    return net


def _iface(sys_root: Path, name: str, physical: bool) -> None:
    d = sys_root / "class" / "net" / name
    (d / "statistics").mkdir(parents=True)
    (d / "operstate").write_text("up\n")
    (d / "statistics" / "rx_dropped").write_text("0\n")
    if physical:
        (d / "device").mkdir()


def test_named_interfaces_are_read_even_without_a_device_link(tmp_path: Path) -> None:
    _iface(tmp_path, "eth0", physical=False)  # a veth in a namespace
    _iface(tmp_path, "ens1", physical=True)
    assert [p.port for p in read_eth_ports(tmp_path)] == ["ens1"]
    assert [p.port for p in read_eth_ports(tmp_path, ["eth0"])] == ["eth0"]


def test_the_tcp_mib_is_a_pseudo_port_with_deltas(tmp_path: Path) -> None:
    net = _net(tmp_path)
    first = read_tcp(net)
    assert first is not None and first.counters["retrans_segs"] == 3
    mon = HostMonitor(HostPaths(sys_root=tmp_path / "sys", net_dir=net))
    assert mon.net_records() == []  # the baseline
    _net(tmp_path, retrans=10, outs=160)
    (rec,) = mon.net_records()
    assert (rec["port"], rec["link"]) == ("tcp", "tcp")
    assert rec["counters"]["retrans_segs"] == 7 and rec["counters"]["out_segs"] == 60


def test_peers_say_towards_whom_bytes_are_stuck(tmp_path: Path) -> None:
    view = read_tcp_peers(_net(tmp_path))
    assert view is not None
    assert view.local == {"10.213.7.2": 2}
    assert view.peers["10.213.7.1"] == {
        "sockets": 1, "backed_up": 1, "tx_queue_bytes": 500, "retransmitting": 1,
    }  # fmt: skip
    assert view.peers["10.213.7.3"]["backed_up"] == 0
    assert "127.0.0.1" not in view.peers
    recs = HostMonitor(HostPaths(net_dir=tmp_path / "net")).peer_records()
    assert {r["port"] for r in recs} == {"tcp-local@10.213.7.2", "tcp@10.213.7.1", "tcp@10.213.7.3"}


def test_no_net_directory_means_no_tcp_records(tmp_path: Path) -> None:
    assert read_tcp(tmp_path / "absent") is None
    assert HostMonitor(HostPaths(net_dir=tmp_path / "absent")).peer_records() == []
