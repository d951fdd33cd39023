"""Ship spooled records to the service: batching, gzip, auth, acks, retries, dead letters.

Owns the HTTP conversation of DESIGN.md §3 (`POST <server>/api/v1/ingest`). A batch's
`seq` is fixed when the spool builds it and reused on every retry, so the service's
`(agent.id, seq)` de-duplication makes retries harmless. It must never retry a batch the
service rejected as invalid (400) — that batch goes to a dead-letter file — and never
hammer a server that says "later" (429/503 honour Retry-After).
"""

from __future__ import annotations

import base64
import email.utils
import gzip
import http.client
import json
import logging
import random
import select
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agents.spool import Identity, Spool, write_atomic
from agents.wire import MAX_BATCH_BYTES, iso_ts

log = logging.getLogger("faultline.agent.sender")

# A misconfigured proxy answering "Retry-After: 86400" must not silence a node for a day.
MAX_RETRY_AFTER_S = 600.0

ActionSink = Callable[[list[dict[str, Any]]], None]


class AuthError(RuntimeError):
    """The service refused the token (401/403): retrying cannot help, a human must act."""


@dataclass(frozen=True)
class AgentInfo:
    id: str
    node: str
    version: str
    boot_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "node": self.node, "version": self.version}
        if self.boot_id:
            out["boot_id"] = self.boot_id
        return out


# A server here is reached directly whatever *_proxy says (tests, sidecars).
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def opener_for(server: str) -> urllib.request.OpenerDirector:
    """An opener that ignores *_proxy variables for a loopback server (tests, sidecars)."""
    host = urllib.parse.urlsplit(server).hostname or ""
    if host in LOOPBACK:
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def _proxy_for(server: str) -> urllib.parse.SplitResult | None:
    """The proxy urllib would use for `server` (*_proxy, no_proxy), never for loopback."""
    parts = urllib.parse.urlsplit(server)
    host = parts.hostname or ""
    if host in LOOPBACK or urllib.request.proxy_bypass(host):
        return None
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy:
        return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    return urllib.parse.urlsplit(proxy)


class IngestConnection:
    """One persistent HTTP/1.1 connection to the ingest URL, reopened when it is lost.

    A connection per batch makes the service accept, parse and close one per batch: ~0.3 ms
    of web CPU a batch on plain HTTP (docs/performance.md), plus a handshake over TLS. Same
    TLS as urllib (the default context: system CAs, SSL_CERT_FILE/SSL_CERT_DIR), same
    proxies (*_proxy and no_proxy; https through a CONNECT tunnel). A kept-alive connection
    the server closed while idle is noticed before the send (the socket reads EOF) and
    reopened; one that fails mid-request because the server closed it just then is retried
    once on a fresh connection. Either way the batch keeps its seq, so a request the server
    did store is answered as a duplicate, never stored twice.
    """

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"server URL must be http:// or https://, not {url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port
        self.target = parts.path or "/"
        self.extra_headers: dict[str, str] = {}
        self.proxy = _proxy_for(url)
        self.opened = 0  # connections opened, for tests and logs
        self._conn: http.client.HTTPConnection | None = None

    def _open(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        proxy_auth: dict[str, str] = {}
        if self.proxy is not None and self.proxy.username:
            user = urllib.parse.unquote(self.proxy.username)
            password = urllib.parse.unquote(self.proxy.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            proxy_auth = {"Proxy-Authorization": f"Basic {token}"}
        if self.proxy is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=self.timeout)
        elif self.https:  # TLS to the server through a CONNECT tunnel, as urllib does
            conn = http.client.HTTPSConnection(
                self.proxy.hostname or "", self.proxy.port, timeout=self.timeout
            )
            conn.set_tunnel(self.host, self.port, headers=proxy_auth)
        else:  # plain HTTP through a forward proxy: absolute URL as the request target
            conn = http.client.HTTPConnection(
                self.proxy.hostname or "", self.proxy.port or 80, timeout=self.timeout
            )
            self.target = self.url
            self.extra_headers = proxy_auth
        self.opened += 1
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _idle_and_closed(self) -> bool:
        """Whether the server closed (or reset) the kept-alive connection while it was idle."""
        sock = self._conn.sock if self._conn is not None else None
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        # Nothing is due from the server between requests: readable means EOF or a reset
        # (or bytes no request asked for); either way the connection is done.
        return bool(readable)

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        """POST `body`; (status, headers, payload). Raises OSError/HTTPException when the
        server cannot be reached or the exchange breaks on a fresh connection."""
        if self._idle_and_closed():
            self.close()
        for attempt in (1, 2):
            reused = self._conn is not None and self._conn.sock is not None
            if self._conn is None:
                self._conn = self._open()
            try:
                self._conn.request("POST", self.target, body, {**headers, **self.extra_headers})
                response = self._conn.getresponse()
                payload = response.read()
            except (
                http.client.RemoteDisconnected,
                ConnectionResetError,
                BrokenPipeError,
                ConnectionAbortedError,
            ):
                self.close()
                if reused and attempt == 1:
                    # The server closed this kept-alive connection as we used it. Whether
                    # it stored the batch first or not, resending the same seq is safe.
                    log.debug("kept-alive connection closed by the server; reconnecting")
                    continue
                raise
            except (OSError, http.client.HTTPException):
                self.close()
                raise
            if response.will_close:
                self.close()
            return response.status, response.headers, payload
        raise AssertionError("unreachable")  # pragma: no cover


def retry_after_seconds(value: str | None, default: float) -> float:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date)."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(
    failures: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after `failures` failed tries in a row: exponential, always jittered,
    so that a fleet of agents that lost the service at the same instant never retries in
    lockstep.

    Below the cap the wait is drawn from [base/2, base * 2**failures] (full jitter, with a
    floor so a flapping link is not hammered). At the cap it is drawn from [cap/2, cap],
    not from zero: with every agent waiting uniform(0, cap), the agents' first tries after
    the link returns are front-loaded (each is the rest of a wait in progress, and a long
    wait is more likely to be the one in progress): the first second after an outage
    carried twice the mean rate of the recovery. From the cap's upper half the first half
    of the recovery is flat at 4/3 of the mean (tests/agents/test_backoff.py).
    """
    draw = (rng or random).uniform
    ceiling = base * (2 ** min(failures, 16))
    if ceiling >= cap:
        return draw(cap / 2, cap)
    return draw(base / 2, max(base, ceiling))


class Sender:
    """Drains the spool into the service, one batch in flight at a time."""

    def __init__(
        self,
        spool: Spool,
        identity: Identity,
        info: AgentInfo,
        *,
        server: str,
        token: str,
        state_dir: Path,
        interval: float = 1.0,
        max_records: int = 1000,
        timeout: float = 10.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        dry_run: bool = False,
        on_actions: ActionSink | None = None,
        out: IO[str] | None = None,
    ) -> None:
        self.spool = spool
        self.identity = identity
        self.info = info
        self.url = server.rstrip("/") + "/api/v1/ingest"
        self.token = token
        self.interval = interval
        self.max_records = max_records
        self.timeout = timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.dry_run = dry_run
        self.on_actions = on_actions
        self.out = out or sys.stdout
        self.dead_letter_dir = Path(state_dir) / "deadletter"
        self.failures = 0
        self.sent_batches = 0
        self.quarantined = 0
        self.replayed = 0  # acknowledged batches sent again because the service lost them
        self._connection = IngestConnection(self.url, timeout)
        self._wake = threading.Event()
        self.linger = min(0.05, interval)

    def wake(self) -> None:
        """Send soon: an event (Xid, process exit) should not wait for the next tick."""
        self._wake.set()

    def envelope(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {
            "agent": self.info.as_dict(),
            "seq": batch["seq"],
            "sent_at": iso_ts(),
            "records": batch["records"],
        }

    def _backoff(self) -> float:
        return backoff_delay(self.failures, self.backoff_base, self.backoff_cap)

    def _post(self, body: bytes) -> tuple[int, Any, bytes]:
        """One POST on the agent's kept-alive connection (IngestConnection)."""
        return self._connection.post(
            body,
            {
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
                "Authorization": f"Bearer {self.token}",
                "User-Agent": f"faultline-agent/{self.info.version}",
            },
        )

    def send_once(self) -> tuple[str, float]:
        """Try one batch. Returns (outcome, seconds to wait before the next try)."""
        batch = self.spool.pending_batch() or self.spool.build_batch(
            self.identity, max_records=self.max_records
        )
        if batch is None:
            return "idle", self.interval
        envelope = self.envelope(batch)
        if self.dry_run:
            print(json.dumps(envelope, separators=(",", ":")), file=self.out, flush=True)
            self.spool.discard(batch["seq"])
            return "acked", self._next_wait()
        raw = json.dumps(envelope, separators=(",", ":")).encode()
        if len(raw) > MAX_BATCH_BYTES:
            return self._too_large(batch, b'{"error": "batch over the size limit (agent side)"}')
        body = gzip.compress(raw, 5)
        try:
            status, headers, payload = self._post(body)
        except (OSError, http.client.HTTPException) as exc:
            self.failures += 1
            wait = self._backoff()
            log.warning(
                "ingest unreachable (%s); batch seq=%s retried in %.1fs", exc, batch["seq"], wait
            )
            return "retry", wait
        if status in (200, 202):
            self.failures = 0
            self.sent_batches += 1
            self.spool.ack(batch["seq"])
            reply = self._reply(payload)
            self._deliver_actions(reply)
            if self._replay_lost(batch["seq"], reply):
                return "acked", 0.0  # what the service lost goes first, at once
            return "acked", self._next_wait()
        if status == 413:
            return self._too_large(batch, payload)
        if status == 400:
            # A final answer: retrying the same bytes can only fail the same way.
            self._quarantine(batch, payload)
            return "quarantined", 0.0
        if status in (401, 403):
            raise AuthError(
                f"the service refused this agent's token (HTTP {status}) at {self.url}: "
                "check --token / FAULTLINE_AGENT_TOKEN(_FILE) and that the agent is registered"
            )
        self.failures += 1
        if status in (429, 503):
            retry_after = headers.get("Retry-After") if headers else None
            wait = min(MAX_RETRY_AFTER_S, retry_after_seconds(retry_after, self._backoff()))
            # Never sooner than asked, and not all at once: every agent the service turned
            # away in one second reads the same Retry-After, and would come back together
            # (and be turned away together) for as long as it is busy.
            wait *= random.uniform(1.0, 1.5)
        else:
            wait = self._backoff()
        log.warning(
            "ingest answered HTTP %s; batch seq=%s retried in %.1fs", status, batch["seq"], wait
        )
        return "retry", wait

    def _next_wait(self) -> float:
        # Drain a backlog at full speed; otherwise batch by time.
        return 0.0 if self.spool.depth >= self.max_records else self.interval

    @staticmethod
    def _reply(payload: bytes) -> dict[str, Any]:
        try:
            reply = json.loads(payload or b"{}")
        except ValueError:
            return {}
        return reply if isinstance(reply, dict) else {}

    def _deliver_actions(self, reply: dict[str, Any]) -> None:
        actions = reply.get("actions") or []
        if self.on_actions is not None and isinstance(actions, list) and actions:
            self.on_actions(actions)

    def _replay_lost(self, ack_seq: int, reply: dict[str, Any]) -> bool:
        """Re-queue the acknowledged batches the reply's receipts say the service lacks
        (a failover lost them: agents/replay.py); True when there were any."""
        if "high_water" not in reply:
            return False  # a service from before the replay window: nothing to compare
        high_water, gaps = reply["high_water"], reply.get("gaps") or []
        if not (high_water is None or isinstance(high_water, int)) or not isinstance(gaps, list):
            return False
        try:
            moved = self.spool.reconcile(ack_seq, high_water, gaps)
        except (TypeError, ValueError):  # a malformed gap list: keep the window as it is
            return False
        if not moved:
            return False
        self.replayed += len(moved)
        log.warning(
            "the service lacks %d batch(es) it acknowledged before (seqs %s..%s; its high-water "
            "mark for this agent was %s): re-sending them from the replay window",
            len(moved),
            moved[0],
            moved[-1],
            high_water,
        )
        return True

    def _too_large(self, batch: dict[str, Any], payload: bytes) -> tuple[str, float]:
        """Split a batch over the limit into halves (sent next); one record alone is kept."""
        if self.spool.split(batch, self.identity):
            log.warning(
                "batch seq=%s (%d records) is over the service's size limit: split in two",
                batch["seq"],
                len(batch["records"]),
            )
            return "split", 0.0
        self._quarantine(batch, payload)
        return "quarantined", 0.0

    def _quarantine(self, batch: dict[str, Any], payload: bytes) -> None:
        """A 400 is final: keep the batch and the service's reason, never resend it."""
        try:
            error = json.loads(payload)
        except ValueError:
            error = {"error": payload[:500].decode(errors="replace")}
        log.error(
            "ingest rejected batch seq=%s: %s (dead-lettered)", batch["seq"], json.dumps(error)
        )
        self.dead_letter_dir.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"error": error, "batch": batch}).encode()
        write_atomic(self.dead_letter_dir / f"batch-{batch['seq']}.json", body)
        self.quarantined += 1
        self.spool.discard(batch["seq"])

    def run(self, stop: threading.Event) -> None:
        """Loop until `stop`; AuthError propagates so the agent can stop with its message."""
        while not stop.is_set():
            _, wait = self.send_once()
            if wait > 0 and self._wake.wait(wait) and not stop.is_set():
                # Linger briefly after a wake-up: an Xid or a burst of exits usually
                # brings company, and one batch is cheaper than ten.
                time.sleep(self.linger)
            self._wake.clear()

    def stop(self) -> None:
        self._wake.set()

    def close(self) -> None:
        """Close the kept-alive connection (the agent is exiting)."""
        self._connection.close()

    def flush(self, deadline_s: float = 5.0) -> bool:
        """Best-effort drain before exit; True when the spool is empty."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            outcome, _wait = self.send_once()
            if outcome == "idle":
                return True
            if outcome == "retry":
                return False
        return self.spool.depth == 0
