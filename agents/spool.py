"""Bounded on-disk spool between collectors and the sender, plus the agent's identity.

Owns durability on the node: records survive agent restarts and server outages, batches
keep their `seq` across retries, and `seq` never repeats after a restart. It must not
talk to the network or decide what a record means beyond "sample" versus "everything else".

Layout under the state dir:
  state.json               agent id and the next batch seq (atomic rename + fsync)
  spool/events/*.seg       append-only JSON lines: every kind except samples
  spool/samples/*.seg      append-only JSON lines: device_sample and heartbeat
  spool/<lane>/cursor.json how far the lane has moved into batches; drop count
  spool/inflight/<seq>.json the one built-but-unacknowledged batch (resent as is)
  spool/window/<seq>.json  acknowledged batches of the last replay window (agents/replay.py)

Fsync policy: every append is flushed to the OS at once, so a killed or crashed agent loses
nothing; both lanes are fsynced by `sync()` (each sampling tick, about once a second, and
before a batch is built), so a power cut loses at most that last second. Fsync per record
would cap the reporter channel at a few hundred records a second on ordinary disks.
Cursors, batches and state are written to a temp file, fsynced and renamed. Delivery is
at-least-once: a crash between writing a batch and moving the cursor resends those
records in a later batch.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

from agents.replay import DEFAULT_MAX_BYTES as REPLAY_MAX_BYTES
from agents.replay import ReplayWindow, lost
from agents.wire import MAX_BATCH_BYTES, Record

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# Records per batch stay this far under the service's body limit: the envelope (agent,
# seq, sent_at) and JSON re-encoding must fit in what is left.
BATCH_BYTES = MAX_BATCH_BYTES - 64 * 1024
SAMPLE_KINDS = frozenset({"device_sample", "heartbeat", "net_sample", "host_sample"})


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return default


class Identity:
    """The agent's uuid and batch sequence, persisted so a restart continues `seq`."""

    def __init__(self, state_dir: Path) -> None:
        self._path = Path(state_dir) / "state.json"
        self._path.parent.mkdir(parents=True, exist_ok=True)
        state = read_json(self._path, {})
        self.agent_id: str = state.get("agent_id") or str(uuid.uuid4())
        self._next_seq: int = int(state.get("next_seq", 1))
        self._lock = threading.Lock()
        self._save()

    def _save(self) -> None:
        body = {"agent_id": self.agent_id, "next_seq": self._next_seq}
        write_atomic(self._path, json.dumps(body).encode())

    def allocate_seq(self) -> int:
        """Reserve the next seq; it is persisted before it is used, so it is never reused."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            self._save()
            return seq

    @property
    def next_seq(self) -> int:
        return self._next_seq


class _Lane:
    """Append-only segment files with a read cursor."""

    def __init__(self, root: Path, segment_bytes: int, fsync_each: bool) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync_each = fsync_each
        cursor = read_json(root / "cursor.json", {})
        self.cur_seg: int = int(cursor.get("segment", 0))
        self.cur_off: int = int(cursor.get("offset", 0))
        self.dropped: int = int(cursor.get("dropped", 0))
        self.segments = sorted(int(p.stem) for p in root.glob("*.seg"))
        self._fh: Any = None
        self.bytes = 0
        for seg in [s for s in self.segments if s < self.cur_seg]:
            # Fully sent before a crash that came between saving the cursor and deleting.
            self._path(seg).unlink()
            self.segments.remove(seg)
        for seg in self.segments:
            self.bytes += self._repair(seg)
        self.depth = sum(self._count(seg) for seg in self.segments)
        self._dirty = False

    def _path(self, seg: int) -> Path:
        return self.root / f"{seg:012d}.seg"

    def _repair(self, seg: int) -> int:
        """Cut a torn last line (a crash mid-append) so the segment ends on a newline."""
        path = self._path(seg)
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(path, "r+b") as fh:
                fh.truncate(keep)
            return keep
        return len(data)

    def _count(self, seg: int) -> int:
        if seg < self.cur_seg:
            return 0
        with open(self._path(seg), "rb") as fh:
            if seg == self.cur_seg:
                fh.seek(self.cur_off)
            return sum(1 for _ in fh)

    def append(self, line: bytes) -> None:
        if self._fh is None or self._fh.tell() >= self.segment_bytes:
            self._roll()
        self._fh.write(line)
        self._fh.flush()
        if self.fsync_each:
            os.fsync(self._fh.fileno())
        else:
            self._dirty = True
        self.bytes += len(line)
        self.depth += 1

    def _roll(self) -> None:
        if self._fh is not None:
            os.fsync(self._fh.fileno())
            self._fh.close()
        seg = (self.segments[-1] + 1) if self.segments else max(self.cur_seg, 0)
        self.segments.append(seg)
        self._fh = open(self._path(seg), "ab")  # noqa: SIM115 -- kept open for appends

    def sync(self) -> None:
        if self._fh is not None and self._dirty:
            os.fsync(self._fh.fileno())
            self._dirty = False

    def read(self, max_records: int, max_bytes: int) -> tuple[list[bytes], tuple[int, int]]:
        """Up to `max_records` lines from the cursor, and the cursor just after them."""
        lines: list[bytes] = []
        size = 0
        seg, off = self.cur_seg, self.cur_off
        for s in self.segments:
            if s < seg:
                continue
            if s > seg:
                seg, off = s, 0
            with open(self._path(s), "rb") as fh:
                fh.seek(off)
                for line in fh:
                    if not line.endswith(b"\n"):
                        break  # being written right now: leave it for the next batch
                    if len(lines) >= max_records or (lines and size + len(line) > max_bytes):
                        return lines, (seg, off)
                    lines.append(line)
                    size += len(line)
                    off += len(line)
        return lines, (seg, off)

    def commit(self, cursor: tuple[int, int], taken: int) -> None:
        self.cur_seg, self.cur_off = cursor
        self.depth = max(0, self.depth - taken)
        self.save_cursor()
        for seg in list(self.segments):
            if seg < self.cur_seg:
                self._delete(seg)

    def save_cursor(self) -> None:
        body = {"segment": self.cur_seg, "offset": self.cur_off, "dropped": self.dropped}
        write_atomic(self.root / "cursor.json", json.dumps(body).encode())

    def _delete(self, seg: int) -> None:
        path = self._path(seg)
        try:
            self.bytes -= path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            pass
        self.segments.remove(seg)

    def drop_oldest(self) -> bool:
        """Delete the oldest segment (rolling first if it is the one being written)."""
        if not self.segments:
            return False
        if len(self.segments) == 1:
            if self._fh is None or self._fh.tell() == 0:
                return False
            self._roll()
        seg = self.segments[0]
        lost = self._count(seg)
        self._delete(seg)
        self.dropped += lost
        self.depth = max(0, self.depth - lost)
        if self.cur_seg <= seg:
            self.cur_seg, self.cur_off = seg + 1, 0
        self.save_cursor()
        return True

    def close(self) -> None:
        if self._fh is not None:
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None


class Spool:
    """Records in, batches out. Thread-safe; one batch in flight at a time."""

    def __init__(
        self,
        state_dir: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int | None = None,
        replay_window_s: float = 0.0,
        replay_max_bytes: int = REPLAY_MAX_BYTES,
    ) -> None:
        root = Path(state_dir) / "spool"
        self.max_bytes = max_bytes
        seg = segment_bytes or max(4096, min(4 * 1024 * 1024, max_bytes // 32))
        self._events = _Lane(root / "events", seg, fsync_each=False)
        self._samples = _Lane(root / "samples", seg, fsync_each=False)
        self._inflight_dir = root / "inflight"
        self._inflight_dir.mkdir(parents=True, exist_ok=True)
        self.replay = ReplayWindow(
            root / "window", window_s=replay_window_s, max_bytes=replay_max_bytes
        )
        self._lock = threading.Lock()

    # -- writing ---------------------------------------------------------------------
    def append(self, rec: Record, *, in_order: bool = False) -> None:
        """Spool `rec`: samples in their lane (dropped first, sent after events), anything
        else in the events lane. `in_order`: a sample that must go out in order with the
        events (a heartbeat attesting a job before the job's first record)."""
        line = (json.dumps(rec, separators=(",", ":"), allow_nan=False) + "\n").encode()
        sample = rec.get("kind") in SAMPLE_KINDS and not in_order
        lane = self._samples if sample else self._events
        with self._lock:
            # Make room: samples go first; events only once no sample is left to drop.
            while self._events.bytes + self._samples.bytes + len(line) > self.max_bytes:
                if not (self._samples.drop_oldest() or self._events.drop_oldest()):
                    break
            lane.append(line)

    def sync(self) -> None:
        with self._lock:
            self._events.sync()
            self._samples.sync()

    # -- batches ---------------------------------------------------------------------
    def pending_batch(self) -> dict[str, Any] | None:
        """The built-but-unacknowledged batch, if any (after a restart too)."""
        with self._lock:
            files = sorted(self._inflight_dir.glob("*.json"), key=lambda p: int(p.stem))
            for path in files:
                batch: dict[str, Any] | None = read_json(path, None)
                if batch is not None:
                    return batch
                path.unlink()  # torn write: its records are still behind the lane cursor
            return None

    def build_batch(
        self, identity: Identity, *, max_records: int = 1000, max_bytes: int = BATCH_BYTES
    ) -> dict[str, Any] | None:
        """Move up to `max_records` records into a new batch with a fresh seq, or None."""
        with self._lock:
            self._events.sync()  # what goes out must be on disk first
            self._samples.sync()
            ev_lines, ev_cur = self._events.read(max_records, max_bytes)
            used = sum(len(x) for x in ev_lines)
            room = max_records - len(ev_lines)
            sa_lines, sa_cur = (
                self._samples.read(room, max(1, max_bytes - used)) if room > 0 else ([], None)
            )
            if not ev_lines and not sa_lines:
                return None
            records = []
            for line in (*ev_lines, *sa_lines):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue  # a corrupt line cannot be sent; skip it rather than jam
            seq = identity.allocate_seq()
            batch = {"seq": seq, "records": records}
            write_atomic(self._inflight_dir / f"{seq}.json", json.dumps(batch).encode())
            self._events.commit(ev_cur, len(ev_lines))
            if sa_cur is not None:
                self._samples.commit(sa_cur, len(sa_lines))
            return batch

    def split(self, batch: dict[str, Any], identity: Identity) -> bool:
        """Replace an in-flight batch by two halves with fresh seqs; False if it is one record.

        For a batch the service refused as too large (413): its records still go, in order,
        instead of being dead-lettered. The halves are written before the original is
        removed, so a crash in between resends records (at-least-once), never loses them.
        """
        records = batch["records"]
        if len(records) < 2:
            return False
        with self._lock:
            middle = len(records) // 2
            for part in (records[:middle], records[middle:]):
                seq = identity.allocate_seq()
                body = json.dumps({"seq": seq, "records": part}).encode()
                write_atomic(self._inflight_dir / f"{seq}.json", body)
            with contextlib.suppress(FileNotFoundError):
                (self._inflight_dir / f"{batch['seq']}.json").unlink()
        return True

    def ack(self, seq: int) -> None:
        """The service stored batch `seq`: into the replay window (or gone, without one)."""
        with self._lock:
            self.replay.keep(seq, self._inflight_dir / f"{seq}.json")

    def discard(self, seq: int) -> None:
        """Batch `seq` will never be stored (dead-lettered, or no service): gone for good."""
        with self._lock, contextlib.suppress(FileNotFoundError):
            (self._inflight_dir / f"{seq}.json").unlink()

    def reconcile(self, ack_seq: int, high_water: int | None, gaps: list[list[int]]) -> list[int]:
        """After the 202 of `ack_seq` (and its `ack`): the window's batches the service's
        receipts say it lacks go back in flight, lowest seq first; then the window forgets
        what is older than it. Returns the seqs to be sent again."""
        with self._lock:
            moved = self.replay.take(
                lost(self.replay.seqs, ack_seq, high_water, gaps), self._inflight_dir
            )
            self.replay.expire()
            return moved

    # -- introspection ---------------------------------------------------------------
    @property
    def depth(self) -> int:
        # Under the lock: between a batch's file being written and the lanes' cursors
        # moving, its records are in both, and a heartbeat read then counted them twice.
        with self._lock:
            inflight = 0
            for path in self._inflight_dir.glob("*.json"):
                batch = read_json(path, {})
                inflight += len(batch.get("records", []))
            return self._events.depth + self._samples.depth + inflight

    @property
    def dropped(self) -> int:
        return self._events.dropped + self._samples.dropped

    @property
    def dropped_events(self) -> int:
        return self._events.dropped

    @property
    def bytes(self) -> int:
        return self._events.bytes + self._samples.bytes

    def close(self) -> None:
        with self._lock:
            self._events.close()
            self._samples.close()
            self._events.save_cursor()
            self._samples.save_cursor()
