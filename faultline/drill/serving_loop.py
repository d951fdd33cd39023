"""One serving worker of the drill: a tiny attention LM served by a real process.

Owns the serving loop the serving rows break: requests arrive as files in
`<dir>/inbox/<worker>/` (the drill's router writes them), the worker claims each (rename
into `<dir>/claimed/<worker>/`), prefills its prompt into a per-request KV cache, and
decodes one greedy token per request per tick (continuous batching), streaming every
token as one complete line to `<dir>/streams/<rid>.<worker>.tok` (a token counts as
delivered once its line is complete) and writing `<dir>/done/<rid>.<worker>` when the
request finished. A request may carry `resume`: tokens the client already received from
a worker that died; the worker re-prefills prompt + resume (repeated KV work) and streams
only what follows, so each token index is streamed once. Every `--window-s` it reports a
serving window through the reporter (requests, SLO met, TTFT/TPOT percentiles, queued,
active, live KV use, retries, duplicate tokens, the window's request-id range) with its
model, adapter and KV-schema versions; `<dir>/control/<worker>.json` switches versions
(in-flight requests finish on the old one first). `<dir>/state/<worker>.json` holds the
live counters for the drill (KV tokens, active). It must not talk to the service: the
reporter and the agent carry everything. The model is a pure function of the model and
adapter versions, so the drill computes every request's reference output itself.

    python -m faultline.drill.serving_loop --group serve --worker w0 --dir /tmp/serve
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VOCAB = 61
DIM = 16
KV_CAPACITY_TOKENS = 2048  # the worker's KV cache, in token slots
MAX_ACTIVE = 8
SLO_TTFT_MS = 2000.0  # the service's default ceilings: a request met its SLO under them
SLO_TPOT_MS = 150.0


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


class TinyLM:
    """One attention layer over a real per-request KV cache, float64, token by token (so a
    re-prefill gives bit-identical keys and values: a resumed request continues exactly)."""

    def __init__(self, model_version: str, adapter_version: str | None = None) -> None:
        import torch

        self.torch = torch
        g = torch.Generator().manual_seed(_seed(model_version))
        self.emb = torch.randn(VOCAB, DIM, generator=g, dtype=torch.float64)
        self.wq, self.wk, self.wv = (
            torch.randn(DIM, DIM, generator=g, dtype=torch.float64) / DIM**0.5 for _ in range(3)
        )
        self.wo = torch.randn(DIM, VOCAB, generator=g, dtype=torch.float64)
        if adapter_version:  # a low-rank adapter: changes the output projection
            ga = torch.Generator().manual_seed(_seed(adapter_version))
            a = torch.randn(DIM, 2, generator=ga, dtype=torch.float64)
            b = torch.randn(2, VOCAB, generator=ga, dtype=torch.float64)
            self.wo = self.wo + 0.5 * (a @ b)

    def feed(self, cache: list[Any], token: int) -> int:
        """Append `token`'s key and value to `cache`; return the greedy next token."""
        torch = self.torch
        e = self.emb[token]
        cache.append((e @ self.wk, e @ self.wv))
        keys = torch.stack([k for k, _ in cache])
        values = torch.stack([v for _, v in cache])
        att = torch.softmax(keys @ (e @ self.wq) / DIM**0.5, dim=0)
        h = att @ values + e
        return int(torch.argmax(h @ self.wo))


def generate(
    model: TinyLM, prompt: list[int], n: int, resume: list[int] | None = None
) -> list[int]:
    """The whole output of a request (what the drill checks streams against)."""
    cache: list[Any] = []
    out = list(resume or [])
    nxt = 0
    for tok in prompt + out:
        nxt = model.feed(cache, tok)
    while len(out) < n:
        out.append(nxt)
        nxt = model.feed(cache, nxt)
    return out


@dataclass
class Request:
    rid: str
    prompt: list[int]
    n: int
    enqueued: float
    fd: int
    out: list[int] = field(default_factory=list)
    cache: list[Any] = field(default_factory=list)
    nxt: int = 0
    first_token_at: float | None = None
    resumed: int = 0  # tokens already delivered by a worker that died


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        from agents import reporter

        self.args = args
        self.dir: Path = args.dir
        self.name: str = args.worker
        for sub in ("inbox", "claimed"):
            (self.dir / sub / self.name).mkdir(parents=True, exist_ok=True)
        for sub in ("streams", "done", "control", "state"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.rep = reporter.init(group=args.group, hooks=False)
        self.versions = {
            "model_version": args.model_version,
            "adapter_version": args.adapter_version or None,
            "kv_schema": args.kv_schema,
        }
        self.model = TinyLM(args.model_version, args.adapter_version or None)
        self.control_seen = 0.0
        self.pending: dict[str, Any] | None = None
        self.active: dict[str, Request] = {}
        self.stopping = False
        self._reset_window()

    def _reset_window(self) -> None:
        self.window_began = time.monotonic()
        self.finished: list[tuple[float, float, float]] = []  # ttft, tpot, e2e (ms)
        self.rids: list[str] = []
        self.retries = 0
        self.duplicates = 0

    # -- requests --------------------------------------------------------------------------
    def _claim(self) -> None:
        inbox = self.dir / "inbox" / self.name
        for path in sorted(inbox.glob("*.json")):
            if len(self.active) >= MAX_ACTIVE:
                return
            claimed = self.dir / "claimed" / self.name / path.name
            try:
                os.rename(path, claimed)
                req = json.loads(claimed.read_text())
            except (OSError, ValueError):
                continue
            self._start(req)

    def _start(self, req: dict[str, Any]) -> None:
        rid = req["rid"]
        stream = self.dir / "streams" / f"{rid}.{self.name}.tok"
        fd = os.open(stream, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        r = Request(rid, list(req["prompt"]), int(req["n"]), float(req["enqueued"]), fd)
        r.out = list(req.get("resume") or [])
        r.resumed = len(r.out)
        if r.resumed:
            self.retries += 1  # a re-run of a request a dead worker held
        for tok in r.prompt + r.out:  # prefill (for a resumed request: recomputed KV)
            r.nxt = self.model.feed(r.cache, tok)
        self.active[rid] = r
        self.rids.append(rid)

    def _decode(self) -> None:
        now = time.time()
        for rid in list(self.active):
            r = self.active[rid]
            index = len(r.out)
            r.out.append(r.nxt)
            # One complete line per token, one write: a torn line (a kill mid-write) is
            # not delivered, and the resume regenerates that index.
            os.write(r.fd, (json.dumps({"i": index, "t": r.nxt}) + "\n").encode())
            if r.first_token_at is None:
                r.first_token_at = now
            if len(r.out) >= r.n:
                self._finish(r, now)
            else:
                r.nxt = self.model.feed(r.cache, r.nxt)

    def _finish(self, r: Request, now: float) -> None:
        os.close(r.fd)
        del self.active[r.rid]
        streamed = len(r.out) - r.resumed
        ttft = ((r.first_token_at or now) - r.enqueued) * 1000
        tpot = (now - (r.first_token_at or now)) * 1000 / max(1, streamed - 1)
        self.finished.append((ttft, tpot, (now - r.enqueued) * 1000))
        self.rids.append(r.rid)
        done = {"worker": self.name, "tokens": len(r.out), "streamed": streamed, **self.versions}
        tmp = self.dir / "done" / f".{r.rid}.{self.name}"
        tmp.write_text(json.dumps(done))
        os.replace(tmp, self.dir / "done" / f"{r.rid}.{self.name}")
        (self.dir / "claimed" / self.name / f"{r.rid}.json").unlink(missing_ok=True)

    # -- versions --------------------------------------------------------------------------
    def _check_control(self) -> None:
        path = self.dir / "control" / f"{self.name}.json"
        with contextlib.suppress(OSError, ValueError):
            mtime = path.stat().st_mtime
            if mtime != self.control_seen:
                self.control_seen = mtime
                self.pending = json.loads(path.read_text())
        if self.pending is not None and not self.active:
            # In-flight requests finished on the old version; now load the new one.
            self.model = TinyLM(self.pending["model_version"], self.pending.get("adapter_version"))
            self.versions = {
                "model_version": self.pending["model_version"],
                "adapter_version": self.pending.get("adapter_version") or None,
                "kv_schema": self.pending["kv_schema"],
            }
            self.pending = None

    # -- reporting -------------------------------------------------------------------------
    def kv_tokens(self) -> int:
        return sum(len(r.cache) for r in self.active.values())

    def _report(self) -> None:
        seconds = max(0.001, time.monotonic() - self.window_began)
        queued = len(list((self.dir / "inbox" / self.name).glob("*.json")))
        met = sum(1 for t, p, _ in self.finished if t <= SLO_TTFT_MS and p <= SLO_TPOT_MS)
        window: dict[str, Any] = {
            "seconds": round(seconds, 3),
            "requests": len(self.finished),
            "slo_met": met,
            "queued": queued,
            "active": len(self.active),
            "kv_used_pct": round(100.0 * self.kv_tokens() / KV_CAPACITY_TOKENS, 2),
            "retries": self.retries,
            "duplicate_tokens": self.duplicates,
        }
        for key, idx, q in (
            ("ttft_ms_p50", 0, 0.5),
            ("ttft_ms_p99", 0, 0.99),
            ("tpot_ms_p50", 1, 0.5),
            ("tpot_ms_p99", 1, 0.99),
            ("e2e_ms_p99", 2, 0.99),
        ):
            value = _pct([f[idx] for f in self.finished], q)
            if value is not None:
                window[key] = value
        ids = sorted(set(self.rids) | set(self.active))
        if ids:
            window["first_request_id"], window["last_request_id"] = ids[0], ids[-1]
        self.rep.serving_window(self.name, window, ready=True, **self.versions)
        self._reset_window()

    def _state(self) -> None:
        state = {
            "pid": os.getpid(),
            "ts": time.time(),
            "active": sorted(self.active),
            "kv_tokens": self.kv_tokens(),
            "ready": self.pending is None,
            **self.versions,
        }
        tmp = self.dir / "state" / f".{self.name}.json"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.dir / "state" / f"{self.name}.json")

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        self._report()  # ready, empty: the worker joins the group at once
        while not self.stopping:
            self._check_control()
            if self.pending is None:
                self._claim()
            self._decode()
            self._state()
            if time.monotonic() - self.window_began >= self.args.window_s:
                self._report()
            time.sleep(self.args.tick_s)
        self.rep.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faultline.drill.serving_loop")
    parser.add_argument("--group", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--model-version", default="toy-v1")
    parser.add_argument("--adapter-version", default="")
    parser.add_argument("--kv-schema", default="kv-1")
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--tick-s", type=float, default=0.02, help="one decode step")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    return Worker(args).run()


if __name__ == "__main__":
    sys.exit(main())
