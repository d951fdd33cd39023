"""A group's live judgement state, updated from the records since the last pass.

A diagnosis pass used to rebuild its snapshot from every retained record (at 16k ranks
~200k step rows, re-parsed each pass). `LiveGroup` keeps the per-rank part of the snapshot
(steps, processes, newest collective window and process-groups report per rank) as plain
data and folds in only the records that arrived since the last pass (`apply`); `snapshot`
then rebuilds the `RankState` of the ranks those records touched, or whose retained window
moved with the clock, and reuses every other one as is. The non-rank evidence (devices,
checkpoints, transitions, host, serving: sized by nodes and events, not steps x ranks) is
passed in whole each pass and goes through `build_snapshot` as before.

The result equals `build_snapshot` over the same records (tests/diagnosis/test_live.py
proves it over random timelines), with the retention the database adapter applies to a
full read (`Retention`) done here in memory. Pure: no I/O, no clock; the caller passes `now`,
and the database cursors it keeps in `cursors` are opaque here.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from operator import is_, itemgetter
from typing import Any, TypeGuard

from console.diagnosis.records import Objectives, ServingSlo
from console.diagnosis.snapshot import (
    RANK_KINDS,
    CollectiveWindow,
    GroupSnapshot,
    ProcessGroup,
    ProcessRecord,
    RankState,
    StepRecord,
    _process,
    _process_groups,
    _step,
    _window,
    build_snapshot,
    contract_states,
    heartbeats_of,
    new_rank_state,
    node_states,
    rank_placement,
)

__all__ = ["LiveGroup", "Retention"]

# (ts, arrival order, record): the order a stable sort of every record by ts gives.
_Keyed = tuple[datetime, int, Any]


@dataclass(frozen=True, slots=True)
class Retention:
    """What a full read retains per rank, so the live state keeps exactly that.

    Steps: those newer than `step_window`, the newest `step_cap` of them; a rank with none
    keeps its newest step of the last `history` (a hung rank must stay in the snapshot).
    Processes and the collective window: those of the last `history`. None: keep
    everything (the tests' reference).
    """

    step_window: timedelta | None = None
    step_cap: int | None = None
    history: timedelta | None = None


@dataclass(slots=True)
class _Rank:
    gen: int
    node: tuple[datetime, int, str] | None = None  # newest rank-kind record naming a node
    steps: list[_Keyed] = field(default_factory=list)
    procs: list[_Keyed] = field(default_factory=list)
    window: _Keyed | None = None  # newest collective window of the group's generation
    report: _Keyed | None = None  # newest process_groups report of the group's generation
    state: RankState | None = None  # cached; None when the records changed
    # `procs` frozen, and the GPU the newest of them names; None when `procs` changed.
    # Its processes, the GPU its generation named, the GPU an older one named last.
    frozen_procs: tuple[tuple[ProcessRecord, ...], str | None, str | None] | None = None
    # The steps of the last state built, and whether `steps` is still them followed by
    # records appended since (no record went in between): then the next state's steps are
    # a slide of them (RankState.slid_from).
    shown: tuple[StepRecord, ...] = ()
    grown: bool = True
    expires: datetime | None = None  # when the retained view next changes with the clock


@dataclass(slots=True)
class LiveGroup:
    """One group's per-rank evidence as plain data; see the module docstring."""

    group: str
    generation: int
    retention: Retention = field(default_factory=Retention)
    cursors: dict[str, Any] = field(default_factory=dict)  # the adapter's; opaque here
    ranks: dict[int, _Rank] = field(default_factory=dict)
    last_now: datetime | None = None
    _order: int = 0
    _active: list[int] | None = None  # sorted ranks of the generation; None: recompute
    _groups: tuple[ProcessGroup, ...] | None = None  # None: recompute
    # What `snapshot` needs to touch only what changed (a 16k-rank pass in which nothing
    # per-rank changed used to walk every rank): the ranks `apply` changed since the last
    # snapshot, each active rank's position in `_active` and the state the last snapshot
    # showed there (None: everything it reported aged out), that snapshot's ranks, the
    # soonest expiry of a rank's retained view (never later than the true one: it only
    # triggers a walk of every rank), and the non-rank part it was built from.
    _dirty: set[int] = field(default_factory=set)
    _pos: dict[int, int] = field(default_factory=dict)
    _kept: list[RankState | None] = field(default_factory=list)
    _shown: tuple[RankState, ...] | None = None
    _soonest: datetime | None = None
    _base: _Base | None = None
    touched: int = 0  # ranks rebuilt by the last `snapshot` (for the benchmark)
    memo: dict[str, Any] = field(default_factory=dict)  # `diagnose(..., memo=)` between passes
    samples: dict[int, Any] = field(default_factory=dict)  # `build_snapshot(samples_memo=)`
    devices: dict[str, Any] = field(default_factory=dict)  # `build_snapshot(devices_memo=)`

    def apply(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Fold newly arrived records in (oldest first within the call, as read); records of
        kinds not per-rank are ignored (they are passed to `snapshot`). Returns how many."""
        n = 0
        order = self._order
        ranks, group = self.ranks, self.group
        for r in records:
            get = r.get
            kind = get("kind")
            if kind not in RANK_KINDS or get("rank") is None:
                continue
            if get("group") not in (None, group):
                continue
            n += 1
            order += 1
            ts, rank = r["ts"], int(r["rank"])
            gen = int(get("generation") or 0)
            st = ranks.get(rank)
            if st is None:
                st = ranks[rank] = _Rank(gen=gen)
                self._active = None
            elif gen > st.gen:
                st.gen = gen
                st.node = None  # a new generation may run elsewhere (as build_snapshot)
                st.frozen_procs = None
                self._active = None
            if gen == st.gen and get("node") and (st.node is None or (ts, order) >= st.node[:2]):
                st.node = (ts, order, r["node"])
            if kind == "step":
                steps = st.steps
                if not steps or ts > steps[-1][0]:  # a newer ts (`order` only breaks ties)
                    steps.append((ts, order, _step(r)))
                else:
                    insort(steps, (ts, order, _step(r)), key=_key)
                    st.grown = False
            elif kind == "process":
                _add(st.procs, (ts, order, _process(r)))
                st.frozen_procs = None
            elif gen == self.generation:
                item = (ts, order, _window(r) if kind == "collective" else r)
                slot = "window" if kind == "collective" else "report"
                old = getattr(st, slot)
                if old is None or (ts, order) >= old[:2]:
                    setattr(st, slot, item)
                    if slot == "report":
                        self._groups = None
            st.state = None
            self._dirty.add(rank)
        self._order = order
        return n

    def snapshot(
        self,
        *,
        state: str,
        records: list[dict[str, Any]],
        nodes: dict[str, datetime | None],
        contract_findings: list[dict[str, Any]],
        now: datetime,
        slo: Mapping[str, Any] | None = None,
        objectives: Mapping[str, Any] | None = None,
    ) -> GroupSnapshot:
        """The group's snapshot at `now`: `records` are the non-rank evidence of this pass
        (a full read of them, as `build_snapshot` takes). `now` must not go back."""
        if self.last_now is not None and now < self.last_now:
            raise ValueError("LiveGroup.snapshot: now went back; rebuild the state")
        self.last_now = now
        base, dev_node, moved = self._non_rank(
            state=state,
            records=records,
            nodes=nodes,
            contract_findings=contract_findings,
            now=now,
            slo=slo,
            objectives=objectives,
        )
        ranks_of = self.ranks
        walk = moved  # every rank: a GPU moved node (a rank's node may come from it)
        if self._active is None:
            self._active = sorted(rk for rk, st in ranks_of.items() if st.gen == self.generation)
            self._groups = None
            self._pos = {rk: i for i, rk in enumerate(self._active)}
            self._kept = [None] * len(self._active)
            self._shown = None
            walk = True
        elif self._soonest is not None and now > self._soonest:
            walk = True  # some rank's retained view may have moved with the clock
        todo: Iterable[int] = self._active if walk else self._dirty
        self._dirty = set()
        pos, kept = self._pos, self._kept
        soonest = None if walk else self._soonest
        touched = changed = 0
        for rk in todo:
            i = pos.get(rk)
            if i is None:
                continue  # a rank of another generation: not shown
            st = ranks_of[rk]
            cached = st.state
            if cached is None or (st.expires is not None and now > st.expires):
                touched += 1
                cached = st.state = self._rank_state(rk, st, now, dev_node)
            elif moved and (f := st.frozen_procs) is not None and f[1] is None and f[2]:
                # Its GPU is an older generation's, kept while on the node it names: a GPU
                # that moved node may change that (rank_placement).
                touched += 1
                cached = st.state = self._rank_state(rk, st, now, dev_node)
            elif st.node is None and cached.node != dev_node.get(cached.gpu or ""):
                cached = st.state = replace(cached, node=dev_node.get(cached.gpu or ""))
            exp = st.expires
            if exp is not None and (soonest is None or exp < soonest):
                soonest = exp
            # Everything it reported aged out: a full read would not see it.
            shown = (
                None
                if st.report is None and not (cached.steps or cached.processes or cached.collective)
                else cached
            )
            if kept[i] is not shown:
                kept[i] = shown
                changed += 1
        self._soonest = soonest
        self.touched = touched
        ranks = self._shown
        if ranks is None or changed:
            ranks = self._shown = tuple(filter(_is_state, kept))
        if self._groups is None:
            reports = {rk: ranks_of[rk].report for rk in self._active}
            self._groups = _process_groups({rk: r[2] for rk, r in reports.items() if r})
        return replace(
            base,
            kind="serving" if base.serving and not ranks else "training",
            taken_at=now,
            ranks=ranks,
            process_groups=self._groups,
        )

    def _non_rank(
        self,
        *,
        state: str,
        records: list[dict[str, Any]],
        nodes: dict[str, datetime | None],
        contract_findings: list[dict[str, Any]],
        now: datetime,
        slo: Mapping[str, Any] | None,
        objectives: Mapping[str, Any] | None,
    ) -> tuple[GroupSnapshot, dict[str, str | None], bool]:
        """`build_snapshot` of the non-rank records, the GPUs' nodes, and whether a GPU's
        node changed since the last pass.

        The very same record dicts as last pass (a pass triggered by the clock, or by
        steps alone; the caller keeps an unchanged record's dict, as `samples` asks) reuse
        the last build, whose parts are functions of the records alone, but for the few
        made from the other arguments (the nodes' heartbeats, the group's state, its
        contract findings, SLO and objectives), made again when those changed."""
        old = self._base
        same = old is not None and len(old.records) == len(records)
        if old is None or not same or not all(map(is_, old.records, records)):
            base = build_snapshot(
                group=self.group,
                generation=self.generation,
                state=state,
                records=[r for r in records if r.get("kind") not in RANK_KINDS],
                nodes=nodes,
                contract_findings=contract_findings,
                now=now,
                slo=slo,
                objectives=objectives,
                samples_memo=self.samples,
                devices_memo=self.devices,
            )
            if old is not None and old.snap.devices is base.devices:
                dev_node = old.dev_node
            else:
                dev_node = {d.gpu: d.node for d in base.devices}
            moved = old is None or dev_node != old.dev_node
            beats: list[Mapping[str, Any]] = [r for r in records if r.get("kind") == "heartbeat"]
        else:
            base, dev_node, moved, beats = old.snap, old.dev_node, False, old.beats
            changed: dict[str, Any] = {}
            if state != base.state:
                changed["state"] = state
            if nodes != old.nodes:
                changed["nodes"] = node_states(heartbeats_of(self.group, nodes, beats))
            if contract_findings != old.contract_findings:
                changed["contract_findings"] = contract_states(contract_findings)
            if slo != old.slo:
                changed["slo"] = ServingSlo.from_mapping(slo)
            if objectives != old.objectives:
                changed["objectives"] = Objectives.from_mapping(objectives)
            if changed:
                base = replace(base, **changed)
        # Copies of the arguments: a caller that mutated a container in place between passes
        # must not compare equal to itself (the records' dicts are taken unmodified).
        self._base = _Base(
            list(records),
            beats,
            dict(nodes),
            list(contract_findings),
            None if slo is None else dict(slo),
            None if objectives is None else dict(objectives),
            base,
            dev_node,
        )
        return base, dev_node, moved

    def _rank_state(
        self, rk: int, st: _Rank, now: datetime, dev_node: Mapping[str, str | None]
    ) -> RankState:
        """Trim the rank's records to the retention at `now` and freeze them."""
        ret = self.retention
        expires: list[datetime] = []
        held = len(st.steps)
        if ret.step_window is not None and st.steps:
            # Steps are kept in (ts, order) order: the window's start is one bisection.
            recent = st.steps[bisect_left(st.steps, now - ret.step_window, key=_ts) :]
            if ret.step_cap is not None:
                recent = recent[-ret.step_cap :]
            if recent:
                expires.append(recent[0][0] + ret.step_window)
            else:
                newest = st.steps[-1]
                keep = ret.history is None or newest[0] >= now - ret.history
                recent = [newest] if keep else []
                if keep and ret.history is not None:
                    expires.append(newest[0] + ret.history)
            st.steps = recent
        elif ret.step_cap is not None:
            st.steps = st.steps[-ret.step_cap :]
        if ret.history is not None and st.procs:
            cutoff = now - ret.history
            if st.procs[0][0] < cutoff:  # kept in (ts, order) order: the oldest goes first
                st.procs = [p for p in st.procs if p[0] >= cutoff]
                st.frozen_procs = None
            if st.procs:
                expires.append(st.procs[0][0] + ret.history)
        if ret.history is not None and st.window is not None:
            if st.window[0] < now - ret.history:
                st.window = None
            else:
                expires.append(st.window[0] + ret.history)
        st.expires = min(expires) if expires else None
        frozen = st.frozen_procs
        if frozen is None:  # processes change rarely: steps every pass
            gen = st.gen
            gpu = next(
                (p[2].gpu for p in reversed(st.procs) if p[2].gpu and p[2].generation == gen), None
            )
            older = next(
                (p[2].gpu for p in reversed(st.procs) if p[2].gpu and p[2].generation < gen), None
            )
            frozen = st.frozen_procs = (tuple(map(_item, st.procs)), gpu, older)
        procs, gpu, older = frozen
        named = st.node[2] if st.node else None
        gpu = rank_placement(gpu, older, named, dev_node)
        # The retention keeps a suffix of the steps: with only appends since the last
        # state, the new steps are the old ones less the trimmed, plus the appended.
        old = st.shown
        slid: tuple[tuple[StepRecord, ...], int] | None = None
        if st.grown and old:
            cut = min(held - len(st.steps), len(old))
            added = len(st.steps) - (len(old) - cut)
            steps = old[cut:] + tuple(map(_item, st.steps[len(st.steps) - added :]))
            slid = (old, cut)
        else:
            steps = tuple(map(_item, st.steps))
        st.shown, st.grown = steps, True
        window: CollectiveWindow | None = st.window[2] if st.window else None
        node = named or dev_node.get(gpu or "")
        return new_rank_state(rk, node, gpu, steps, procs, window, self.generation, slid)


@dataclass(frozen=True, slots=True)
class _Base:
    """The non-rank part of the last snapshot and what it was built from."""

    records: list[Mapping[str, Any]]
    beats: list[Mapping[str, Any]]  # the heartbeat records among them
    nodes: dict[str, datetime | None]
    contract_findings: list[dict[str, Any]]
    slo: dict[str, Any] | None
    objectives: dict[str, Any] | None
    snap: GroupSnapshot
    dev_node: dict[str, str | None]


def _is_state(x: RankState | None) -> TypeGuard[RankState]:
    return x is not None


def _key(item: _Keyed) -> tuple[datetime, int]:
    return item[0], item[1]


def _add(kept: list[_Keyed], item: _Keyed) -> None:
    """Insert in (ts, order) order; a record newer than the newest kept (almost every
    one: agents send in time order) is appended without a bisection."""
    if not kept or item[0] > kept[-1][0]:  # a newer ts; `order` only breaks ties
        kept.append(item)
    else:
        insort(kept, item, key=_key)


_ts = itemgetter(0)  # a kept record's timestamp
_item = itemgetter(2)  # a kept record itself
