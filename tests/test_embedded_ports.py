"""Embedded Valkey never takes a port `faultline up` chose but has not bound yet.

A drill once failed to start: the kernel handed Valkey the web port the supervisor had
picked a moment before, so gunicorn found it in use for 90 s."""

from __future__ import annotations

from typing import Any

import pytest

from faultline import embedded


class _Sock:
    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.port = 0

    def __call__(self, *_: Any) -> _Sock:
        return self

    def __enter__(self) -> _Sock:
        return self

    def __exit__(self, *_: Any) -> None:
        return None

    def bind(self, _addr: tuple[str, int]) -> None:
        self.port = self.ports.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_free_port_skips_the_ports_to_avoid(monkeypatch: pytest.MonkeyPatch) -> None:
    sock = _Sock([41000, 41001, 41002])
    monkeypatch.setattr(embedded.socket, "socket", sock)
    assert embedded.free_port(avoid=frozenset({41000, 41001})) == 41002


def test_free_port_takes_the_first_when_nothing_is_avoided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(embedded.socket, "socket", _Sock([41000, 41001]))
    assert embedded.free_port() == 41000
