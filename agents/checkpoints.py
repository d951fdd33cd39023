"""Watch checkpoint roots and report each checkpoint's life: staging -> written -> committed,
then verified or corrupt, and modified if a committed checkpoint changes afterwards.

Owns reading checkpoint directories on this node; it never writes into them and never
unpickles anything (torch DCP `.metadata` is a pickle: only its presence is used).
Understood layouts, one checkpoint per sub-directory of a configured root:
  torch.distributed.checkpoint: `*.distcp` shards, `.metadata` written last by the
    coordinator (-> written); committed on a `COMMITTED` marker or once sizes hold still
    for one scan after `.metadata` appears.
  manifest: `manifest.json` {"shards": [{"path", "bytes", "sha256"}], "data_cursor"}
    (-> written; the cursor is optional) and a `COMMITTED` marker (-> committed).
Group, generation, step and checkpoint id come from `faultline.json` in the checkpoint
dir ({"group", "generation", "step", "checkpoint_id"}, and optionally "data_cursor": where
a restore resumes the data), else from the root's config, with the step parsed
from the directory name (`step_000100` -> 100).
Hashing runs in one low-priority thread at a bounded read rate so it cannot starve the
trainer's own checkpoint I/O.
A `shared` root is one every node mounts (Lustre, GPFS, NFS, a shared PVC): reported by
one node per group, the one hosting the group's rank 0 (known from the workload's own
records, `saw`), so 2,000 nodes neither send 2,000 copies of each record, each locking the
group's row, nor hash every shard 2,000 times. A node hosting other ranks of the group
follows the checkpoints without reporting or hashing them, so when the job restarts with
rank 0 on it, it reports only what changes from then on; a node that hosts none of the
group's ranks does not look inside its checkpoints at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.spool import read_json, write_atomic
from agents.wire import Record, record

log = logging.getLogger("faultline.agent.checkpoints")

MARKER = "COMMITTED"
META = "faultline.json"
MAX_SHARDS = 4096
_NOT_SHARDS = frozenset({MARKER, META})
TRANSIENT = ".tmp"  # the suffix of a file being written, to be renamed into place
_NAME_RE = re.compile(r"[^A-Za-z0-9_.:@/\-]+")


# A shared root's checkpoint of a group is handled by this node as:
LEAD = "lead"  # it hosts the group's rank 0: it reports and hashes
FOLLOW = "follow"  # it hosts other ranks: it follows phases silently (a later takeover)
SKIP = "skip"  # it hosts none (or its ranks just started): it does not look inside
# After a new generation's first record here, this long for its rank 0 to speak before the
# node settles as a follower: the ranks of a restart start one by one.
SETTLE_S = 30.0
# A node that heard nothing of a group for this long no longer hosts it (the job moved or
# ended). Far longer than a synchronous checkpoint, which pauses the steps.
HOSTED_FOR_S = 3600.0


@dataclass(frozen=True)
class RootConfig:
    path: Path
    group: str | None = None
    generation: int | None = None
    shared: bool = False  # every node mounts it: only the group's rank-0 node reports


@dataclass
class _Hosted:
    """What this node's workload said of a group: its newest generation here, whether rank
    0 of it runs here, when that generation was first and last heard (wall clock)."""

    generation: int
    rank0: bool
    since: float
    heard: float


@dataclass
class _Seen:
    phase: str = ""
    first_seen: float = 0.0
    sizes: dict[str, int] | None = None
    snapshot: dict[str, list[int]] | None = None
    verified: bool = False
    elsewhere: bool = False  # committed while another node led its group: its to hash

    def as_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "snapshot": self.snapshot,
            "verified": self.verified,
            **({"elsewhere": True} if self.elsewhere else {}),
        }


def _files(directory: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} for every file under `directory`, but the
    transient `*.tmp` of a write-then-rename (torch DCP writes `.metadata.tmp`, then
    renames it): a scan that caught one listed it as a shard, and the commit without it
    read as a shard gone missing."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, _, names in os.walk(directory):
        for name in names:
            if name.endswith(TRANSIENT):
                continue
            full = Path(dirpath) / name
            try:
                st = full.stat()
            except FileNotFoundError:
                continue
            out[str(full.relative_to(directory))] = (st.st_size, st.st_mtime_ns)
    return out


def _listing(files: dict[str, tuple[int, int]], fmt: str) -> dict[str, Any]:
    """A manifest from what is on disk (no expected hashes: those come from verification)."""
    names = sorted(k for k in files if k not in _NOT_SHARDS)[:MAX_SHARDS]
    shards: list[dict[str, Any]] = [{"path": k, "bytes": files[k][0]} for k in names]
    return {"shards": shards, "total_bytes": sum(files[k][0] for k in names), "format": fmt}


def manifest_of(path: str | os.PathLike[str], fmt: str) -> dict[str, Any]:
    """The manifest of what a save just wrote at `path`: every file of a checkpoint
    directory (paths relative to it), or the one file a single-file save wrote (its name);
    sizes, no hashes (hashing gigabytes inside the trainer's save hook would stall
    training: `check_shards` hashes them apart, at a bounded rate)."""
    target = Path(path)
    if target.is_file():
        st = target.stat()
        return _listing({target.name: (st.st_size, st.st_mtime_ns)}, fmt)
    return _listing(_files(target), fmt)


def hash_file(path: Path, rate_bytes: int, stop: threading.Event) -> str:
    """sha256 of `path` read at no more than `rate_bytes` per second (the trainer's own
    checkpoint I/O comes first); OSError when `stop` is set midway."""
    digest = hashlib.sha256()
    chunk = min(4 * 1024 * 1024, rate_bytes)
    with open(path, "rb") as fh:
        started = time.monotonic()
        done = 0
        while block := fh.read(chunk):
            digest.update(block)
            done += len(block)
            ahead = done / rate_bytes - (time.monotonic() - started)
            if ahead > 0 and stop.wait(ahead):
                raise OSError(0, "stopping")
    return digest.hexdigest()


def check_shards(
    directory: Path, manifest: dict[str, Any], fmt: str, hash_fn: Callable[[Path], str]
) -> tuple[dict[str, Any], str | None]:
    """Hash every shard of `manifest` under `directory`: the manifest with sizes and
    checksums as found, and the first problem (a shard missing, unreadable, of another
    size or hash than the manifest says; an empty DCP shard), or None."""
    checked: list[dict[str, Any]] = []
    problem: str | None = None
    for shard in manifest.get("shards", []):
        path = directory / shard["path"]
        try:
            digest = hash_fn(path)
            size = path.stat().st_size  # after the read: a shard rewritten meanwhile shows
        except FileNotFoundError:
            problem = problem or f"shard {shard['path']}: missing"
            continue
        except OSError as exc:
            problem = problem or f"shard {shard['path']}: unreadable ({exc.strerror})"
            continue
        if shard.get("bytes") is not None and shard["bytes"] != size:
            problem = problem or f"shard {shard['path']}: {size} bytes, expected {shard['bytes']}"
        elif shard.get("sha256") and shard["sha256"] != digest:
            problem = problem or f"shard {shard['path']}: sha256 mismatch"
        elif size == 0 and fmt == "torch_dcp":
            problem = problem or f"shard {shard['path']}: empty"
        checked.append({"path": shard["path"], "bytes": size, "sha256": digest})
    result = {"shards": checked, "total_bytes": sum(s["bytes"] for s in checked), "format": fmt}
    return result, problem


def _step_from_name(name: str) -> int | None:
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else None


class CheckpointWatcher:
    def __init__(
        self,
        roots: list[RootConfig],
        sink: Callable[[Record], None],
        *,
        state_dir: Path,
        interval_s: float = 2.0,
        verify_rate_bytes: int = 100 * 1024 * 1024,
    ) -> None:
        self.roots = roots
        self.sink = sink
        self.interval_s = interval_s
        self.verify_rate_bytes = max(1, verify_rate_bytes)
        self._state_path = Path(state_dir) / "checkpoints.json"
        self._hosted_path = Path(state_dir) / "checkpoint-groups.json"
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        saved = read_json(self._state_path, {})
        self._seen: dict[str, _Seen] = {
            key: _Seen(
                phase=v.get("phase", ""),
                snapshot=v.get("snapshot"),
                verified=bool(v.get("verified")),
                elsewhere=bool(v.get("elsewhere")),
            )
            for key, v in saved.items()
        }
        # Kept across restarts: an agent restarted mid-job still knows which groups it leads.
        self._hosted: dict[str, _Hosted] = {}
        hosted = read_json(self._hosted_path, {})
        for name, v in (hosted if isinstance(hosted, dict) else {}).items():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self._hosted[name] = _Hosted(
                    int(v["generation"]), bool(v["rank0"]), float(v["since"]), float(v["heard"])
                )
        self._hosted_lock = threading.Lock()
        self._hosted_saved = ""  # what the file holds, as written by this process
        self._verify: queue.Queue[tuple[Path, dict[str, Any]] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._warned: set[str] = set()
        self._queued: set[str] = set()

    # -- which groups this node reports a shared root for --------------------------------
    def saw(self, group: object, generation: object, rank: object) -> None:
        """A workload record of this node (step, process, collective...): which ranks of
        which generation run here. Records of an older generation than the newest heard
        are late and change nothing."""
        if not isinstance(group, str) or not group:
            return
        if not isinstance(generation, int) or not isinstance(rank, int):
            return
        if isinstance(generation, bool) or isinstance(rank, bool):
            return
        name, now = _NAME_RE.sub("_", group)[:128], time.time()
        with self._hosted_lock:
            h = self._hosted.get(name)
            if h is None or generation > h.generation:
                self._hosted[name] = _Hosted(generation, rank == 0, now, now)
            elif generation == h.generation:
                h.heard = now
                h.rank0 = h.rank0 or rank == 0

    def role(self, group: str) -> str:
        """LEAD, FOLLOW or SKIP: what this node does with `group`'s checkpoints in a
        shared root (every checkpoint of an unshared root is this node's own: LEAD)."""
        now = time.time()
        with self._hosted_lock:
            h = self._hosted.get(group)
            if h is None or now - h.heard > HOSTED_FOR_S:
                return SKIP
            if h.rank0:
                return LEAD
            return FOLLOW if now - h.since >= SETTLE_S else SKIP

    # -- identity of a checkpoint --------------------------------------------------------
    def _describe(self, root: RootConfig, directory: Path) -> dict[str, Any] | None:
        meta = read_json(directory / META, {})
        meta = meta if isinstance(meta, dict) else {}
        group = meta.get("group") or root.group
        generation = meta.get("generation", root.generation)
        if not group or not isinstance(generation, int):
            if str(directory) not in self._warned:
                self._warned.add(str(directory))
                log.warning(
                    "%s: no group/generation (write %s or configure the root)", directory, META
                )
            return None
        ckpt_id = str(meta.get("checkpoint_id") or directory.name)
        step = meta.get("step")
        cursor = meta.get("data_cursor")
        if cursor is None and (directory / "manifest.json").is_file():
            # A manifest.json may hold the cursor instead; it is sent as the record's own
            # `data_cursor` either way (one place on the wire).
            listed = read_json(directory / "manifest.json", {})
            cursor = listed.get("data_cursor") if isinstance(listed, dict) else None
        if isinstance(cursor, bool):
            cursor = None
        return {
            "group": _NAME_RE.sub("_", str(group))[:128],
            "generation": generation,
            "checkpoint_id": _NAME_RE.sub("_", ckpt_id)[:128],
            "step": step if isinstance(step, int) else _step_from_name(directory.name),
            # None is omitted from the record (wire.record): no loader state was saved.
            "data_cursor": cursor if isinstance(cursor, int) and cursor >= 0 else None,
        }

    # -- scanning ------------------------------------------------------------------------
    def scan(self) -> None:
        """One pass over every root; emits records for whatever changed since the last."""
        for root in self.roots:
            try:
                children = sorted(p for p in Path(root.path).iterdir() if p.is_dir())
            except FileNotFoundError:
                continue
            for directory in children:
                try:
                    self._check(root, directory)
                except OSError as exc:
                    log.warning("%s: cannot read checkpoint (%s)", directory, exc)
        self._save()

    def _check(self, root: RootConfig, directory: Path) -> None:
        key = str(directory)
        role, ident = LEAD, None
        if root.shared:
            # Who it belongs to before walking it: on a shared filesystem most nodes
            # host none of the group's ranks and must not stat its shards every scan.
            ident = self._describe(root, directory)
            if ident is None or (role := self.role(ident["group"])) == SKIP:
                return
        seen = self._seen.setdefault(key, _Seen(first_seen=time.monotonic()))
        if not seen.first_seen:
            seen.first_seen = time.monotonic()
        files = _files(directory)
        if not files:
            return
        if ident is None:
            ident = self._describe(root, directory)
            if ident is None:
                return
        quiet = role == FOLLOW
        if seen.phase in ("committed", "verified", "corrupt", "modified"):
            self._check_modified(directory, ident, seen, files, quiet=quiet)
            if (
                seen.phase == "committed"
                and not seen.verified
                and not seen.elsewhere
                and not quiet
                and key not in self._queued
            ):
                # Committed before a restart, never verified: verify it now.
                fmt, manifest, _ = self._phase(directory, files, seen)
                self._queue_verify(directory, {**ident, "manifest": manifest, "format": fmt})
            return
        fmt, manifest, phase = self._phase(directory, files, seen)
        if phase == seen.phase:
            return
        duration = (time.monotonic() - seen.first_seen) * 1000.0 if phase == "committed" else None
        if not quiet:
            self._emit(ident, phase, manifest=manifest, duration_ms=duration)
        seen.phase = phase
        if phase == "committed":
            seen.snapshot = {k: list(v) for k, v in files.items() if k not in _NOT_SHARDS}
            # Followed, not led: the leading node hashes it (one read of each shard).
            seen.elsewhere = quiet
            if not seen.verified and not quiet:
                self._queue_verify(directory, {**ident, "manifest": manifest, "format": fmt})

    def _queue_verify(self, directory: Path, job: dict[str, Any]) -> None:
        self._queued.add(str(directory))
        self._verify.put((directory, job))

    def _phase(
        self, directory: Path, files: dict[str, tuple[int, int]], seen: _Seen
    ) -> tuple[str, dict[str, Any], str]:
        sizes = {k: v[0] for k, v in files.items()}
        if ".metadata" in files or any(k.endswith(".distcp") for k in files):
            manifest = _listing(files, "torch_dcp")
            if ".metadata" not in files:
                phase = "staging"
            elif MARKER in files or (seen.phase == "written" and seen.sizes == sizes):
                phase = "committed"
            else:
                phase = "written"
            seen.sizes = sizes
            return "torch_dcp", manifest, phase
        if "manifest.json" in files:
            listed = read_json(directory / "manifest.json", {})
            raw = listed.get("shards", []) if isinstance(listed, dict) else []
            shards: list[dict[str, Any]] = []
            for item in raw[:MAX_SHARDS]:
                if isinstance(item, dict) and item.get("path"):
                    shard: dict[str, Any] = {"path": str(item["path"])[:512]}
                    if isinstance(item.get("bytes"), int):
                        shard["bytes"] = item["bytes"]
                    if isinstance(item.get("sha256"), str):
                        shard["sha256"] = item["sha256"].lower()
                    shards.append(shard)
            total = sum(s.get("bytes", 0) for s in shards)
            manifest = {"shards": shards, "total_bytes": total, "format": "manifest"}
            return "manifest", manifest, "committed" if MARKER in files else "written"
        return "files", _listing(files, "files"), "committed" if MARKER in files else "staging"

    def _check_modified(
        self,
        directory: Path,
        ident: dict[str, Any],
        seen: _Seen,
        files: dict[str, tuple[int, int]],
        *,
        quiet: bool = False,
    ) -> None:
        now = {k: list(v) for k, v in files.items() if k not in _NOT_SHARDS}
        before = seen.snapshot or {}
        if now == before:
            return
        changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))
        what = ", ".join(
            f"{k} {'removed' if k not in now else 'added' if k not in before else 'changed'}"
            for k in changed[:5]
        )
        if not quiet:
            self._emit(ident, "modified", detail=f"committed checkpoint changed: {what}"[:256])
        seen.phase = "modified"
        seen.snapshot = now  # report each change once

    def _emit(
        self,
        ident: dict[str, Any],
        phase: str,
        *,
        manifest: dict[str, Any] | None = None,
        duration_ms: float | None = None,
        detail: str | None = None,
    ) -> None:
        self.sink(
            record(
                "checkpoint",
                **ident,
                phase=phase,
                manifest=manifest,
                duration_ms=None if duration_ms is None else round(duration_ms, 3),
                detail=detail,
            )
        )

    # -- verification --------------------------------------------------------------------
    def verify(self, directory: Path, job: dict[str, Any]) -> Record:
        """Hash every shard; emit and return `verified` or `corrupt` (naming the shard)."""
        result_manifest, problem = check_shards(
            directory, job["manifest"], job["format"], self._hash
        )
        ident = {
            k: job.get(k) for k in ("group", "generation", "checkpoint_id", "step", "data_cursor")
        }
        phase = "corrupt" if problem else "verified"
        rec = record(
            "checkpoint",
            **ident,
            phase=phase,
            manifest=result_manifest,
            detail=problem and problem[:256],
        )
        self.sink(rec)
        seen = self._seen.get(str(directory))
        if seen is not None:
            seen.verified = True
            if seen.phase == "committed":
                seen.phase = phase
        self._save()
        return rec

    def _hash(self, path: Path) -> str:
        return hash_file(path, self.verify_rate_bytes, self._stop)

    def _verify_loop(self) -> None:
        with contextlib.suppress(AttributeError, OSError):
            # Lowest CPU priority for this thread only (Linux: per-thread nice).
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            job = self._verify.get()
            if job is None:
                return
            try:
                self.verify(*job)
            except Exception:
                log.exception("checkpoint verification failed")

    def drain_verification(self) -> None:
        """Run queued verifications in the caller's thread (tests, one-shot checks)."""
        while True:
            try:
                job = self._verify.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self.verify(*job)

    def _scan_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception:
                log.exception("checkpoint scan failed")
            self._stop.wait(self.interval_s)

    def _save(self) -> None:
        body = {k: v.as_json() for k, v in self._seen.items() if v.phase}
        now = time.time()
        with self._hosted_lock:
            for name in [n for n, h in self._hosted.items() if now - h.heard > HOSTED_FOR_S]:
                del self._hosted[name]
            # `heard` to the minute: the file changes when a role does, not at every step.
            hosted = json.dumps(
                {n: {**vars(h), "heard": h.heard // 60 * 60} for n, h in self._hosted.items()}
            )
        with contextlib.suppress(OSError):
            write_atomic(self._state_path, json.dumps(body).encode())
            if hosted != self._hosted_saved:
                write_atomic(self._hosted_path, hosted.encode())
                self._hosted_saved = hosted

    def start(self) -> None:
        for target, name in ((self._scan_loop, "ckpt-scan"), (self._verify_loop, "ckpt-verify")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._verify.put(None)
        for thread in self._threads:
            thread.join(timeout=2)
