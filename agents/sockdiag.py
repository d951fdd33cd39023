"""The kernel's own per-socket TCP counters (sock_diag over netlink), stdlib only.

Why: `/proc/net/tcp` shows a socket *now* (bytes queued, a retransmission timer running),
so under random loss a lossy link is caught only when a read lands while a segment is
being resent. The kernel also keeps, per socket, how many segments it has ever
retransmitted and how many data segments it has sent (`struct tcp_info`:
`tcpi_total_retrans`, `tcpi_data_segs_out`); the difference between two reads says how
lossy the link to that peer was over the whole round, whatever instant the reads land on.
This is what `ss -ti` prints as `retrans:a/b` and `data_segs_out`.

Another network namespace (the drill's namespace nodes, a node whose fabric lives in a
container) is read through a netlink socket opened inside it: a short-lived thread joins
the namespace (`setns`, CAP_SYS_ADMIN), opens the socket and leaves; the socket stays
bound to that namespace. Without the privilege, or on a kernel without sock_diag, `open`
returns None and the caller keeps the `/proc` view alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("faultline.agent.sockdiag")

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
TCP_ESTABLISHED = 1
CLONE_NEWNET = 0x40000000

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_msg: family, state, timer, retrans (4 bytes), then inet_diag_sockid (sport,
# dport, src[16], dst[16], if, cookie[8]: 48 bytes), expires, rqueue, wqueue, uid, inode.
_PORTS, _SRC, _DST, _COOKIE, _MSG_LEN = 4, 8, 24, 44, 72
_RTA = struct.Struct("=HH")
# struct tcp_info offsets (include/uapi/linux/tcp.h; stable, fields only appended).
_TOTAL_RETRANS = 100  # __u32 tcpi_total_retrans
_DATA_SEGS_OUT = 156  # __u32 tcpi_data_segs_out (kernel 4.6+)


@dataclass(frozen=True, slots=True)
class TcpSocket:
    """One established socket's cumulative counters, keyed by the kernel's cookie."""

    cookie: bytes
    local: str
    peer: str
    local_port: int
    peer_port: int
    total_retrans: int
    data_segs_out: int | None  # None on kernels before 4.6


def _request(seq: int) -> bytes:
    """inet_diag_req_v2: IPv4 TCP, established only, with tcp_info; an all-zero sockid
    (every socket)."""
    ext = 1 << (INET_DIAG_INFO - 1)
    body = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, ext, 0, 1 << TCP_ESTABLISHED)
    body += b"\0" * 48
    head = _NLMSG.pack(
        _NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
    )
    return head + body


def parse(buf: bytes) -> tuple[list[TcpSocket], bool]:
    """One netlink read -> (sockets, done). Messages that are not inet_diag replies, or
    too short to hold one, are skipped; an `NLMSG_ERROR` raises OSError."""
    out: list[TcpSocket] = []
    off = 0
    while off + _NLMSG.size <= len(buf):
        length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(buf, off)
        if length < _NLMSG.size or off + length > len(buf):
            break
        body = buf[off + _NLMSG.size : off + length]
        off += (length + 3) & ~3
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", body) if len(body) >= 4 else (0,)
            raise OSError(-err, f"sock_diag: {os.strerror(-err) if err else 'error'}")
        if kind != SOCK_DIAG_BY_FAMILY or len(body) < _MSG_LEN or body[0] != socket.AF_INET:
            continue
        sport, dport = struct.unpack_from(">HH", body, _PORTS)
        src, dst = body[_SRC : _SRC + 4], body[_DST : _DST + 4]
        cookie = body[_COOKIE : _COOKIE + 8]
        info = _tcp_info(body[_MSG_LEN:])
        if info is None or len(info) < _TOTAL_RETRANS + 4:
            continue
        (retrans,) = struct.unpack_from("=I", info, _TOTAL_RETRANS)
        segs = (
            struct.unpack_from("=I", info, _DATA_SEGS_OUT)[0]
            if len(info) >= _DATA_SEGS_OUT + 4
            else None
        )
        out.append(
            TcpSocket(
                cookie=cookie,
                local=socket.inet_ntoa(src),
                peer=socket.inet_ntoa(dst),
                local_port=sport,
                peer_port=dport,
                total_retrans=retrans,
                data_segs_out=segs,
            )
        )
    return out, False


def _tcp_info(attrs: bytes) -> bytes | None:
    off = 0
    while off + _RTA.size <= len(attrs):
        length, kind = _RTA.unpack_from(attrs, off)
        if length < _RTA.size:
            return None
        if kind == INET_DIAG_INFO:
            return attrs[off + _RTA.size : off + length]
        off += (length + 3) & ~3
    return None


class SockDiag:
    """A netlink sock_diag socket (in `netns`, a namespace file such as /run/netns/NAME
    or /proc/<pid>/ns/net, or the agent's own namespace) and a dump of its TCP sockets."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._seq = 0

    @classmethod
    def open(cls, netns: str | Path | None = None) -> SockDiag | None:
        try:
            sock = _open_in(netns) if netns else _new_socket()
        except OSError as e:
            log.info(
                "no per-socket TCP counters (sock_diag%s): %s; reading /proc only",
                f" in {netns}" if netns else "",
                e,
            )
            return None
        return cls(sock)

    def dump(self) -> list[TcpSocket]:
        """Every established IPv4 TCP socket of the namespace, with its counters."""
        self._seq += 1
        self._sock.send(_request(self._seq))
        out: list[TcpSocket] = []
        while True:
            got, done = parse(self._sock.recv(1 << 16))
            out += got
            if done:
                return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


def _new_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    sock.settimeout(2.0)
    return sock


def _open_in(netns: str | Path) -> socket.socket:
    """Open the netlink socket from a thread that joined `netns` (setns is per thread:
    the agent's other threads stay where they are; the thread ends there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    box: dict[str, socket.socket | OSError] = {}

    def join() -> None:
        try:
            fd = os.open(netns, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box["sock"] = _new_socket()
        except OSError as e:
            box["sock"] = e

    t = threading.Thread(target=join, name="sockdiag-setns", daemon=True)
    t.start()
    t.join(5.0)
    got = box.get("sock")
    if isinstance(got, OSError):
        raise got
    if got is None:
        raise OSError("setns thread did not finish")
    return got
