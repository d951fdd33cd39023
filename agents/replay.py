"""The replay window: batches the service acknowledged lately, kept to re-send what it lost.

A 202 means the batch is committed on the service's Postgres primary. With asynchronous
replication a failover to the standby loses the commits the standby had not received yet:
acknowledged batches, gone, and the agent had already let them go. So the agent keeps each
batch for `window_s` seconds after its 202 (at least the replication-lag bound the
deployment promises, docs/operations.md "High availability"), and every 202 tells it what
the service holds of its seqs (`high_water`, `gaps`: agents.replies.Accepted). A seq in the
window above that high-water mark, or inside a gap, was lost: it goes back to the spool's
in-flight batches and is sent again with its own seq, which the service stores as a late
seq inside a gap, once (ingest/store/receipts.py), closing the gap its newer seqs opened.

Owns the window's files (spool/window/<seq>.json, the in-flight batch renamed on its ack)
and the decision which of them the service lacks (`lost`, pure). Never talks to the
network. The window is bounded by time and by bytes; what the byte bound evicts early is
counted (`evicted`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

log = logging.getLogger("faultline.agent.replay")

DEFAULT_WINDOW_S = 30.0
# An hour of batches at full speed would be gigabytes; the byte bound caps it anyway.
MAX_REPLAY_WINDOW_S = 3600.0
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def lost(
    seqs: Iterable[int],
    ack_seq: int,
    high_water: int | None,
    gaps: Sequence[Sequence[int]],
) -> list[int]:
    """The seqs of `seqs` (acknowledged before) that the service lacks, ascending.

    `high_water` and `gaps` are the service's receipts for the agent as the batch `ack_seq`
    found them: None means it holds nothing of the agent. `ack_seq` itself is stored now,
    whatever its receipts said before.
    """
    held = sorted(s for s in seqs if s != ack_seq)
    if not held:
        return []
    if high_water is None:
        return held
    low, high = held[0], held[-1]
    near = [(a, b) for a, b in gaps if b >= low and a <= high]
    if high <= high_water and not near:
        return []  # the common case: everything the window holds is stored
    return [s for s in held if s > high_water or any(a <= s <= b for a, b in near)]


class ReplayWindow:
    """The acknowledged batches of the last `window_s` seconds, as files under `root`.

    Not thread-safe on its own: the spool calls it under its lock. `window_s` of 0 keeps
    nothing (an acknowledged batch is deleted, as before the window existed).
    """

    def __init__(
        self,
        root: Path,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.window_s = window_s
        self.max_bytes = max_bytes
        self.clock = clock
        self.evicted = 0  # batches dropped by the byte bound before their time was up
        self.bytes = 0
        # seq -> (acknowledged at, bytes), in acknowledgement order (oldest first). Wall
        # clock, so a restarted agent can read it back from the files' mtimes.
        self._acked: dict[int, tuple[float, int]] = {}
        root.mkdir(parents=True, exist_ok=True)
        found = []
        for path in root.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                st = path.stat()
                found.append((st.st_mtime, int(path.stem), st.st_size))
        for acked_at, seq, size in sorted(found):
            self._acked[seq] = (acked_at, size)
            self.bytes += size

    def __len__(self) -> int:
        return len(self._acked)

    @property
    def seqs(self) -> list[int]:
        return list(self._acked)

    def path(self, seq: int) -> Path:
        return self.root / f"{seq}.json"

    def keep(self, seq: int, inflight: Path) -> None:
        """Take the acknowledged batch file `inflight` into the window (a rename)."""
        if self.window_s <= 0:
            with contextlib.suppress(FileNotFoundError):
                inflight.unlink()
            return
        target = self.path(seq)
        try:
            os.replace(inflight, target)
            now = self.clock()
            os.utime(target, (now, now))  # its mtime says when it was acknowledged
            size = target.stat().st_size
        except FileNotFoundError:
            return
        old = self._acked.pop(seq, None)
        if old is not None:
            self.bytes -= old[1]
        self._acked[seq] = (now, size)
        self.bytes += size
        while self.bytes > self.max_bytes and len(self._acked) > 1:
            oldest = next(iter(self._acked))
            self._drop(oldest)
            self.evicted += 1

    def expire(self) -> int:
        """Forget batches acknowledged more than `window_s` before now; how many.

        Called right after a 202's receipts were checked against the whole window (the
        spool's `reconcile`): what is older than the window and still here is stored on a
        primary whose standby had it too, by the lag bound, whatever the outage that follows.
        """
        horizon = self.clock() - self.window_s
        gone = 0
        while self._acked:
            seq, (acked_at, _) = next(iter(self._acked.items()))
            if acked_at >= horizon:
                break
            self._drop(seq)
            gone += 1
        return gone

    def take(self, seqs: Iterable[int], inflight_dir: Path) -> list[int]:
        """Move `seqs` back to the in-flight batches (to be sent again); those moved."""
        moved = []
        for seq in seqs:
            if seq not in self._acked:
                continue
            try:
                os.replace(self.path(seq), inflight_dir / f"{seq}.json")
            except FileNotFoundError:
                pass
            else:
                moved.append(seq)
            self.bytes -= self._acked.pop(seq)[1]
        return moved

    def _drop(self, seq: int) -> None:
        self.bytes -= self._acked.pop(seq)[1]
        with contextlib.suppress(FileNotFoundError):
            self.path(seq).unlink()
