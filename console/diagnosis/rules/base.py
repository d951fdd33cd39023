"""The shared context every rule reads and writes during one diagnosis.

Owns indexes over the snapshot (rank, GPU, node), the findings emitted so far (by id,
in emission order), causal lookups (rank -> GPU -> node) and the group's step-time
statistics. Must not decide findings itself: each rule module does that.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property
from itertools import chain, compress
from operator import attrgetter, is_not
from typing import Any

from agents import vocab

from console.diagnosis.config import DiagnosisConfig
from console.diagnosis.findings import (
    MINOR,
    ROOT_CAUSE,
    SEVERITY_RANK,
    SYMPTOM,
    Finding,
    gpu_subject,
    make_finding,
    node_subject,
    rank_subject,
)
from console.diagnosis.rules.digest import RECENT_STEPS, RankDigest, rank_digest
from console.diagnosis.snapshot import (
    CheckpointState,
    CollectiveWindow,
    DeviceState,
    GroupSnapshot,
    RankState,
    StepRecord,
)
from console.diagnosis.stats import mad_sorted, median_sorted

__all__ = ["RECENT_STEPS", "Context"]

# Device faults that stop a rank outright (as opposed to slowing it down): the hardware
# faults but a failed row remap, which leaves the GPU running on the rows it has.
HARD_DEVICE_KINDS = vocab.HARDWARE_FAULT_KINDS - {vocab.ROW_REMAP_FAILURE}
# States in which silence is expected: the group is writing a checkpoint or pausing.
QUIET_STATES = frozenset({vocab.CHECKPOINTING, vocab.QUIESCING})
IN_PROGRESS_PHASES = frozenset({"staging", "written"})
TERMINAL_STATES = vocab.TERMINAL_GROUP_STATES
# The group's typical step (the stall threshold's median and MAD) is read from at most
# this many ranks, every k-th in rank order: a synchronous job's ranks share one step
# time, and 1,024 ranks' recent steps (~32k durations) pin it down as well as 16k ranks'
# 520k. Collecting and sorting 4,096 ranks' (~130k) cost a 16k-rank pass in which every
# rank stepped ~30 ms of its 300 ms goal. Smaller groups: all.
DURATION_RANKS = 1024
# An agent delivers a batch every second or so; a lag beyond this is a backlog, not cadence.
DELIVERY_SLACK_S = 3.0
_WINDOW_KEY = attrgetter("rank", "collective", "node", "gpu")
_TS = attrgetter("ts")
_PER_1000 = (1000.0).__rtruediv__  # x -> x / 1000.0, in C


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Element-wise identity (not equality: an equal but rebuilt state is not reused)."""
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True)))


@dataclass(frozen=True, slots=True)
class _Index:
    """`Context`'s per-rank indexes as a pass built them, for the next pass (the memo)."""

    states: tuple[RankState, ...]
    ranks: dict[int, RankState]
    on_gpu: dict[str, list[int]]
    on_node: dict[str, list[int]]
    digests: dict[int, RankDigest]
    steps: dict[int, tuple[StepRecord, ...]]


class Context:
    """Mutable working state of one `diagnose` call; rules append findings to it."""

    def __init__(
        self,
        snap: GroupSnapshot,
        now: datetime,
        cfg: DiagnosisConfig,
        memo: dict[str, Any] | None = None,
    ) -> None:
        self.snap = snap
        # Per-rank values that are functions of the RankState alone, kept by the caller
        # between passes (console.diagnosis.live): a rank whose state is the very same
        # object as last pass is not recomputed. Plain data; same result with or without.
        self._memo: dict[str, Any] = {} if memo is None else memo
        self.has_memo = memo is not None
        # Every RankState the very object of last pass (an Xid- or sweep-triggered pass
        # between steps): group-wide aggregates over the ranks are reused (`per_pass`).
        prev = self._memo.get("_ranks")
        self.ranks_unchanged = prev is not None and _same(prev, snap.ranks)
        self._memo["_ranks"] = snap.ranks
        if not self.ranks_unchanged:
            self._memo.pop("_pass", None)
        self.now = now
        self.cfg = cfg
        self.findings: dict[str, Finding] = {}
        self._by_subject: dict[str, list[str]] = defaultdict(list)
        devices = self._memo.get("_devices")
        if devices is None or devices[0] is not snap.devices:  # the very tuple: the same GPUs
            devices = self._memo["_devices"] = (snap.devices, {d.gpu: d for d in snap.devices})
        self.devices: dict[str, DeviceState] = devices[1]
        # What the rules read of each rank's steps, derived once per RankState: a rank whose
        # state is the very object of last pass reuses its digest, one whose steps slid
        # (oldest dropped, newer appended) derives the new one from it (rules/digest.py).
        kept: dict[int, tuple[RankState, RankDigest]] = self._memo.setdefault("digests", {})
        # The indexes below as last pass left them: only the ranks whose state is not the
        # very object of last pass are looked at (none in a pass between steps).
        index: _Index | None = self._memo.get("_index")
        if index is not None and len(index.states) == len(snap.ranks):
            ranks, on_gpu, on_node = dict(index.ranks), index.on_gpu, index.on_node
            digests, steps = dict(index.digests), dict(index.steps)
            old = index.states
            for i in compress(range(len(old)), map(is_not, old, snap.ranks)):
                r, was = snap.ranks[i], old[i]
                rk = r.rank
                if rk != was.rank or r.gpu != was.gpu or r.node != was.node:
                    index = None  # a rank moved: index afresh
                    break
                ranks[rk] = r
                hit = kept.get(rk)
                if hit is not None and hit[0] is r:
                    d = hit[1]
                else:
                    d = rank_digest(r, None if hit is None else hit[1])
                    kept[rk] = (r, d)
                digests[rk] = d
                steps[rk] = d.cur
        else:
            index = None
        if index is None:
            ranks, digests, steps, on_gpu, on_node = self._index(snap.ranks, kept)
        self._memo["_index"] = _Index(snap.ranks, ranks, on_gpu, on_node, digests, steps)
        # The rules get their own copies of the node and GPU indexes (a defaultdict grows
        # when read with []).
        self.ranks = ranks
        self.ranks_on_gpu: dict[str, list[int]] = defaultdict(list, on_gpu)
        self.ranks_on_node: dict[str, list[int]] = defaultdict(list, on_node)
        self._digests = digests
        self._steps = steps
        # Set by rules for the engine's recovery advice.
        self.valid_checkpoint: CheckpointState | None = None  # set by `checkpoints`
        self.unsafe_reasons: dict[str, str] = {}  # finding id -> why restart is unsafe
        self.restart_unsafe: str | None = None  # set by `objectives`: any restart, why not
        self.tail_ratio: float | None = None  # set by `stragglers`
        self.phase_medians_ms: dict[str, float] = {}  # set by `stragglers`
        # The median per-rank step time and the straggler limit over it (`stragglers`).
        self.step_scale_ms: dict[str, float] = {}
        # The soonest moment after `now` a verdict may change with no new record (a hang
        # threshold crossed): the caller runs a pass then rather than at the sweep's next
        # tick (`due`; Diagnosis.next_check).
        self.next_check: datetime | None = None

    def due(self, at: datetime) -> None:
        """A rule's verdict may change at `at` by the clock alone: keep the soonest."""
        if at > self.now and (self.next_check is None or at < self.next_check):
            self.next_check = at

    @staticmethod
    def _index(
        states: tuple[RankState, ...], kept: dict[int, tuple[RankState, RankDigest]]
    ) -> tuple[
        dict[int, RankState],
        dict[int, RankDigest],
        dict[int, tuple[StepRecord, ...]],
        dict[str, list[int]],
        dict[str, list[int]],
    ]:
        """Every rank's state, digest and steps by rank, and the ranks on each GPU and node,
        in the snapshot's rank order (one loop: at 16k ranks each walk over them counts)."""
        ranks: dict[int, RankState] = {}
        on_gpu: dict[str, list[int]] = defaultdict(list)
        on_node: dict[str, list[int]] = defaultdict(list)
        digests: dict[int, RankDigest] = {}
        steps: dict[int, tuple[StepRecord, ...]] = {}
        for r in states:
            rk = r.rank
            ranks[rk] = r
            hit = kept.get(rk)
            if hit is not None and hit[0] is r:
                d = hit[1]
            else:
                d = rank_digest(r, None if hit is None else hit[1])
                kept[rk] = (r, d)
            digests[rk] = d
            steps[rk] = d.cur
            if r.gpu:
                on_gpu[r.gpu].append(rk)
            if r.node:
                on_node[r.node].append(rk)
        return ranks, digests, steps, dict(on_gpu), dict(on_node)

    # -- emitting ------------------------------------------------------------------
    def new(self, *, generation: int | None = None, **kw: Any) -> Finding:
        """`make_finding` with this group and generation filled in. A finding about a
        thing of an older generation (a checkpoint it wrote, a violation raised then)
        passes that generation: its fingerprint, so its incident, outlives the restart."""
        return make_finding(
            group=self.snap.group,
            generation=self.snap.generation if generation is None else generation,
            **kw,
        )

    def put(self, finding: Finding) -> Finding:
        """Add or replace (same id) a finding; a replacement keeps the higher severity."""
        old = self.findings.get(finding.id)
        if old is None:
            self._by_subject[finding.subject].append(finding.id)
        elif SEVERITY_RANK[old.severity] < SEVERITY_RANK[finding.severity]:
            finding = replace(finding, severity=old.severity)
        self.findings[finding.id] = finding
        return finding

    def on(self, subject: str) -> list[Finding]:
        return [self.findings[i] for i in self._by_subject.get(subject, ())]

    # -- causality -----------------------------------------------------------------
    def root_of(self, finding: Finding) -> Finding:
        """Follow `caused_by` to the root cause (first cause at each hop)."""
        seen = {finding.id}
        while finding.role == SYMPTOM and finding.caused_by:
            nxt = self.findings.get(finding.caused_by[0])
            if nxt is None or nxt.id in seen:
                break
            seen.add(nxt.id)
            finding = nxt
        return finding

    def device_cause(self, gpu: str | None) -> Finding | None:
        """The hard device root cause on `gpu`, if any."""
        if not gpu:
            return None
        for f in self.on(gpu_subject(gpu)):
            # Only a hardware fault stops the GPU's ranks: an application or informational
            # Xid on the GPU (agents/xid.py class) does not, nor does a minor one.
            if (
                f.kind in HARD_DEVICE_KINDS
                and f.role == ROOT_CAUSE
                and f.severity != MINOR
                and f.evidence.get("takes_gpu_out", True)
            ):
                return f
        return None

    def node_cause(self, node: str | None) -> Finding | None:
        if not node:
            return None
        for f in self.on(node_subject(node)):
            # A node cut off the network stops its ranks as surely as a node that died.
            if f.kind in ("node_down", "network_partition"):
                return f
        return None

    def rank_cause(self, rank: int) -> Finding | None:
        """What stopped `rank`: its GPU, then its node, then a finding on the rank itself."""
        r = self.ranks.get(rank)
        if r is None:
            return None
        hit = self.device_cause(r.gpu) or self.node_cause(r.node)
        if hit is not None:
            return hit
        own = self.on(rank_subject(self.snap.group, rank))
        return self.root_of(own[0]) if own else None

    def covered(self, rank: int) -> bool:
        """True when some finding already speaks for this rank (no second story)."""
        r = self.ranks[rank]
        return bool(
            self.on(rank_subject(self.snap.group, rank))
            or self.device_cause(r.gpu)
            or self.node_cause(r.node)
        )

    def covered_ranks(self) -> set[int]:
        """The ranks `covered` is True for, with the findings so far: one look at each
        subject with findings instead of three per rank (16k waiting or stalled ranks)."""
        by_subject = self._by_subject
        names = self._rank_subjects
        out = {names[s] for s in by_subject.keys() & names.keys() if by_subject[s]}
        for subject, ids in by_subject.items():
            if not ids or subject[:1] not in ("g", "n"):
                continue
            kind, _, name = subject.partition(":")
            if kind == "gpu" and self.device_cause(name) is not None:
                out.update(self.ranks_on_gpu.get(name, ()))
            elif kind == "node" and self.node_cause(name) is not None:
                out.update(self.ranks_on_node.get(name, ()))
        return out

    @cached_property
    def _rank_subjects(self) -> dict[str, int]:
        """Every rank's subject -> the rank (kept while the group's ranks are the same)."""
        group = self.snap.group
        ranks = list(self.ranks)
        out: dict[str, int] = self.keyed(
            "rank_subjects",
            (group, ranks),
            lambda: {rank_subject(group, rk): rk for rk in ranks},
        )
        return out

    def steps(self, r: RankState) -> tuple[StepRecord, ...]:
        """The rank's steps of the active generation, oldest first."""
        return self._steps[r.rank]

    def last_step(self, r: RankState) -> StepRecord | None:
        cur = self._steps[r.rank]
        return cur[-1] if cur else None

    def digest(self, r: RankState) -> RankDigest:
        """The rank's steps as the rules read them (rules/digest.py)."""
        return self._digests[r.rank]

    @property
    def digests(self) -> dict[int, RankDigest]:
        """Every rank's digest, in the snapshot's rank order (read-only)."""
        return self._digests

    def per_rank(self, name: str, r: RankState, compute: Callable[[], Any]) -> Any:
        """`compute()` for rank `r`, or its value from the last pass if `r` is unchanged."""
        slot = self._memo.setdefault(name, {})
        hit = slot.get(r.rank)
        if hit is not None and hit[0] is r:
            return hit[1]
        value = compute()
        slot[r.rank] = (r, value)
        return value

    def per_pass(self, name: str, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()`, a function of every RankState (and of `key`, compared with ==),
        or its value from the last pass when every RankState is the same object and `key`
        is equal. The value is shared between passes: callers must not mutate it."""
        slot = self._memo.setdefault("_pass", {})
        hit = slot.get(name)
        if hit is not None and self.ranks_unchanged and hit[0] == key:
            return hit[1]
        value = compute()
        slot[name] = (key, value)
        return value

    def keyed(self, name: str, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()`, a function of `key` alone (compared with ==, which short-cuts on
        identical elements), or its value from the last pass when `key` is equal. Shared
        between passes: callers must not mutate it."""
        hit = self._memo.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = compute()
        self._memo[name] = (key, value)
        return value

    def slot(self, name: str) -> dict[str, Any] | None:
        """A named part of the caller's memo for state kept up to date between passes
        (the rule's own incremental structure), or None without a memo: the rule then
        computes from the snapshot alone, the reference the memo's result must equal."""
        if not self.has_memo:
            return None
        out: dict[str, Any] = self._memo.setdefault(name, {})
        return out

    # -- progress statistics ---------------------------------------------------------
    @cached_property
    def recent_durations_s(self) -> list[float]:
        """The recent steps' durations in seconds of every k-th rank (DURATION_RANKS),
        ascending."""
        out: list[float] = self.per_pass("durations", None, self._all_durations)
        return out

    def _all_durations(self) -> list[float]:
        """Ascending (the median and the MAD read them sorted; the rest, how many)."""
        ranks = self.snap.ranks
        digests = self._digests
        every = ranks[:: -(-len(ranks) // DURATION_RANKS) or 1]  # every k-th (above)
        return sorted(map(_PER_1000, chain.from_iterable([digests[r.rank].timed for r in every])))

    @cached_property
    def windows(self) -> dict[int, CollectiveWindow]:
        """rank -> its collective window, for the ranks that have one (read-only)."""
        out: dict[int, CollectiveWindow] = self.per_pass(
            "windows",
            None,
            lambda: {r.rank: r.collective for r in self.snap.ranks if r.collective is not None},
        )
        return out

    @cached_property
    def windows_key(self) -> tuple[tuple[int, Any, str | None, str | None], ...]:
        """(rank, collective window, node, GPU) of every rank: what collective matching
        reads. Compared with == against last pass's, a window that is the same object
        costs nothing, so a pass in which no window changed reuses the matching."""
        ranks = self.snap.ranks
        out: tuple[tuple[int, Any, str | None, str | None], ...] = self.per_pass(
            "windows_key", None, lambda: tuple(map(_WINDOW_KEY, ranks))
        )
        return out

    @cached_property
    def _sorted_durations_s(self) -> list[float]:
        """`recent_durations_s`, which are ascending: for the median and the MAD."""
        return self.recent_durations_s

    @cached_property
    def median_duration_s(self) -> float | None:
        """Median of `recent_durations_s` (None when there is none)."""
        d = self._sorted_durations_s
        return median_sorted(d) if d else None

    @cached_property
    def stall_threshold_s(self) -> float | None:
        """max(multiplier x (median + k*MAD), floor); None when there is no history."""
        d = self.recent_durations_s
        m = self.median_duration_s
        if not d or m is None:
            return None
        cfg = self.cfg
        expected = m + cfg.hang_mad_k * mad_sorted(self._sorted_durations_s, m)
        return max(cfg.hang_multiplier * expected, cfg.hang_floor_s)

    def last_progress(self, r: RankState) -> datetime | None:
        """Newest step of the active generation, else the rank's start in it."""
        last = self.last_step(r)
        if last is not None:
            return last.ts
        starts = [p.ts for p in r.processes if p.generation == r.generation]
        return starts[-1] if starts else None

    @cached_property
    def quiet_since(self) -> datetime | None:
        """Since when the group is (or may be) checkpointing or quiescing; None if not."""
        snap = self.snap
        if snap.state in QUIET_STATES:
            into = [t.ts for t in snap.transitions if t.to_state == snap.state]
            return into[-1] if into else self.now
        lasts = [d.cur[-1] for d in self._digests.values() if d.cur]  # each rank's last step
        newest_step: datetime | None = max(map(_TS, lasts), default=None)
        # The last step spent time in the checkpoint phase: async staging may still run.
        ckpt_steps = [s.ts for s in lasts if (s.phases.checkpoint or 0) > 0]
        if ckpt_steps and newest_step is not None and max(ckpt_steps) == newest_step:
            return newest_step
        for c in snap.checkpoints:
            if c.phase in IN_PROGRESS_PHASES and (
                newest_step is None or c.events[-1].ts >= newest_step
            ):
                return c.events[0].ts
        return None

    @cached_property
    def checkpoint_measured_s(self) -> float | None:
        """How long this group's checkpoints take, measured: the longest checkpoint phase of
        its recent steps and the longest recent checkpoint (its reported `duration_ms`, or
        first event to commit). None when no checkpoint was ever measured."""
        seen: list[float] = []
        for r in self.snap.ranks:
            for s in self.steps(r)[-RECENT_STEPS:]:
                if s.phases.checkpoint:
                    seen.append(s.phases.checkpoint / 1000.0)
        for c in self.snap.checkpoints:
            seen.extend(e.duration_ms / 1000.0 for e in c.events if e.duration_ms)
            done = [e.ts for e in c.events if e.phase in ("committed", "verified")]
            if done and c.events[0].phase in IN_PROGRESS_PHASES:
                seen.append((done[0] - c.events[0].ts).total_seconds())
        return max(seen) if seen else None

    @cached_property
    def quiet_grace_s(self) -> float:
        """How long the current quiet period is excused. A state the launcher declared
        (quiescing, checkpointing) and a group whose checkpoints were never measured get
        `checkpoint_grace_s`; a checkpoint inferred from the records (the last step's
        checkpoint phase, a staging/written record) gets `checkpoint_grace_factor` x the
        measured duration (at least the floor), capped by `checkpoint_grace_s`: a rank that
        hangs right after a 300 ms save is not excused for 30 minutes."""
        cfg = self.cfg
        measured = self.checkpoint_measured_s
        if self.snap.state in QUIET_STATES or measured is None:
            return cfg.checkpoint_grace_s
        grace = max(cfg.checkpoint_grace_factor * measured, cfg.checkpoint_grace_floor_s)
        return min(grace, cfg.checkpoint_grace_s)

    @property
    def quiet(self) -> bool:
        """Checkpointing or quiescing, and still within its grace (`quiet_grace_s`)."""
        since = self.quiet_since
        return since is not None and (self.now - since).total_seconds() <= self.quiet_grace_s

    @cached_property
    def lagging_nodes(self) -> dict[str, datetime]:
        """node -> the newest record it delivered, for nodes that lag the clock by more
        than DELIVERY_SLACK_S (an agent between sends, or replaying a spool) but are not
        yet silent. What such a node's ranks did after that is not known yet: rules judge
        them as of that time. Past the heartbeat timeout the nodes rule judges the node,
        and its ranks are judged now again."""
        slack = timedelta(seconds=DELIVERY_SLACK_S)
        silent = timedelta(seconds=self.cfg.heartbeat_timeout_s)
        return {
            n.name: n.last_heartbeat
            for n in self.snap.nodes
            if n.last_heartbeat is not None and slack < self.now - n.last_heartbeat <= silent
        }

    def known_at(self, node: str | None) -> datetime:
        """Up to when a node's evidence is known: its newest delivery if it lags, else now."""
        return self.lagging_nodes.get(node or "", self.now)

    @cached_property
    def generation_start(self) -> datetime | None:
        ts = [t.ts for t in self.snap.transitions if t.generation == self.snap.generation]
        return ts[0] if ts else None

    @cached_property
    def placement_unknown_since(self) -> datetime | None:
        """When this generation began, if it follows another one and none of its ranks has
        said where it runs yet (no node, no GPU); else None.

        Until then the group's nodes are still those its previous generation ran on
        (console.snapshots reads them from the rank rows, which keep their last node): a
        node or GPU fault from before this moment belongs to the generation it stopped,
        and to the node's own incident, not to a restart that may have moved away from
        it. Rules that judge node evidence without a rank to tie it to (device, host)
        judge only what came after this until the ranks say where they run."""
        if self.ranks_on_node or self.ranks_on_gpu:
            return None
        start = self.generation_start
        snap = self.snap
        if start is None or not any(t.generation < snap.generation for t in snap.transitions):
            return None
        return start

    def capped(self, items: Sequence[Any]) -> list[Any]:
        """Evidence lists stay short: the first `max_evidence_items` items."""
        return list(items[: self.cfg.max_evidence_items])

    def age_s(self, ts: datetime | None) -> float | None:
        return None if ts is None else (self.now - ts).total_seconds()

    def gpu_label(self, gpu: str | None) -> str:
        """'node-17 GPU 5' when the device is known, else the UUID."""
        dev = self.devices.get(gpu or "")
        if dev is None or dev.index is None:
            return f"GPU {gpu}"
        return f"{dev.node or '?'} GPU {dev.index}"
