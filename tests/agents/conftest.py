"""Shared fixtures for the agent tests: a stub ingest server and short socket paths."""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents.protocol import ContractError, decode_batch


class StubIngest:
    """A tiny stand-in for the service: validates with the real contract, de-duplicates by
    (agent id, seq), and can go away and come back on the same port. It keeps connections
    alive (HTTP/1.1) as gunicorn does, counts them, and can close them like a server whose
    keep-alive timeout ran out."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.batches: list[dict[str, Any]] = []  # accepted, unique
        self.seen: set[tuple[str, int]] = set()
        self.attempts: list[tuple[int, dict[str, str]]] = []  # (seq, headers) of every POST
        self.duplicates = 0
        self.invalid: list[str] = []
        self.script: list[tuple[int, dict[str, str], bytes]] = []  # forced responses
        self.drop_response_once_for: int | None = None
        self.actions: list[dict[str, Any]] = []
        self.polled_actions: list[dict[str, Any]] = []
        self.results: dict[str, dict[str, Any]] = {}
        self._server: ThreadingHTTPServer | None = None
        self.lock = threading.Lock()
        self.connections = 0  # accepted since the fixture started
        self.open_sockets: set[socket.socket] = set()
        self.close_next_reused = False  # drop the next request on a kept-alive connection
        self.paths: list[str] = []  # request targets of ingest POSTs

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def records(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for b in self.batches for r in b["records"]]

    def close_idle(self) -> None:
        """Close every open connection, as a server does when its keep-alive timeout ends."""
        with self.lock:
            sockets, self.open_sockets = list(self.open_sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def start(self) -> None:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as gunicorn's gthread workers

            def setup(self) -> None:
                super().setup()
                self.requests = 0
                with stub.lock:
                    stub.connections += 1
                    stub.open_sockets.add(self.connection)

            def finish(self) -> None:
                with stub.lock:
                    stub.open_sockets.discard(self.connection)
                super().finish()

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None):
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.startswith("/api/v1/agents/actions"):
                    with stub.lock:
                        actions, stub.polled_actions = stub.polled_actions, []
                    self._reply(200, {"actions": actions})
                else:
                    self._reply(404, {"error": "no such page"})

            def _hang_up(self) -> None:
                """Close the connection without an answer."""
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                self.requests += 1
                with stub.lock:
                    drop_unread = stub.close_next_reused and self.requests > 1
                    if drop_unread:
                        stub.close_next_reused = False
                if drop_unread:
                    # The keep-alive timeout ran out just as this request came in: closed,
                    # never read (gunicorn's poller closing an idle connection).
                    self._hang_up()
                    return
                if self.path.startswith("/api/v1/actions/"):
                    action_id = self.path.split("/")[4]
                    with stub.lock:
                        stub.results[action_id] = json.loads(raw)
                    self._reply(200, {})
                    return
                body = (
                    gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
                )
                envelope = json.loads(body)
                with stub.lock:
                    stub.attempts.append((envelope["seq"], dict(self.headers)))
                    stub.paths.append(self.path)
                    forced = stub.script.pop(0) if stub.script else None
                if forced is not None:
                    status, headers, payload = forced
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                try:
                    decode_batch(body)
                except ContractError as exc:
                    with stub.lock:
                        stub.invalid.append(exc.message)
                    self._reply(400, exc.as_dict())
                    return
                key = (envelope["agent"]["id"], envelope["seq"])
                with stub.lock:
                    duplicate = key in stub.seen
                    if duplicate:
                        stub.duplicates += 1
                    else:
                        stub.seen.add(key)
                        stub.batches.append(envelope)
                    actions, stub.actions = stub.actions, []
                    drop = stub.drop_response_once_for == envelope["seq"]
                    if drop:
                        stub.drop_response_once_for = None
                if drop:
                    # Stored, but the ack is lost: the agent must retry the same seq.
                    self._hang_up()
                    return
                self._reply(
                    202, {"ack_seq": envelope["seq"], "duplicate": duplicate, "actions": actions}
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.close_idle()  # a service that went away takes its connections with it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stub() -> Iterator[StubIngest]:
    server = StubIngest()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short path: Unix socket paths are limited to ~107 bytes, pytest's tmp_path is long."""
    path = Path(tempfile.mkdtemp(prefix="fl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def validate(records: list[dict[str, Any]]) -> Any:
    """Wrap records in an envelope and check them against contract v1."""
    envelope = {
        "agent": {"id": "a" * 8 + "-test", "node": "n1", "version": "0.1.0"},
        "seq": 1,
        "sent_at": "2026-11-29T10:00:00.000Z",
        "records": records,
    }
    return decode_batch(json.dumps(envelope, allow_nan=False).encode())
