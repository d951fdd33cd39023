"""A TCP relay from an address inside a drill namespace to a port on the host's loopback.

Owns one listening socket made inside the namespace (only the thread that makes it enters
the namespace, with setns(2), and leaves again: the socket stays where it was made) and
two pump threads per connection to the service in the host's own namespace. This lets
agents in one drill namespace reach a service that listens on 127.0.0.1 through the
namespace's veth (its loss, its rate, its link going down) without touching the host's
network. It relays bytes only: it never reads, buffers or answers a request itself, and a
side that closes or breaks closes the other side too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def listen_in(netns: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port inside `netns` (/run/netns/<netns>)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter_make_leave() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                made.append(socket.create_server((host, port), backlog=512))
            finally:
                _setns(own)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            failed.append(exc)
        finally:
            os.close(own)
            os.close(target)

    # A thread of its own: were leaving the namespace to fail, only that thread is left in
    # it, never the caller's.
    thread = threading.Thread(target=enter_make_leave, name="relay-listen")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


class Relay:
    """Accepts on `listener` and relays each connection to 127.0.0.1:`port`."""

    def __init__(self, listener: socket.socket, port: int) -> None:
        self.listener, self.port = listener, port
        self.connections = 0
        self._stop = threading.Event()
        self._accept = threading.Thread(target=self._serve, name="relay-accept", daemon=True)

    def start(self) -> Relay:
        self._accept.start()
        return self

    def _serve(self) -> None:
        self.listener.settimeout(0.5)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        client.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        client.close()
        upstream.close()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        self._accept.join(5)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy src to dst until src ends or breaks, then end both sockets: HTTP never half
    closes, and the other pump (blocked reading dst) must wake up and finish too."""
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
