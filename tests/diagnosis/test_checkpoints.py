from __future__ import annotations

from datetime import timedelta

from console.diagnosis import diagnose
from tests.diagnosis.factory import (
    T0,
    checkpoint,
    device_event,
    heartbeats,
    of_kind,
    snap,
    training,
)

NOW = T0 + timedelta(seconds=3)  # inside the 4 s hang floor: healthy ranks are not hung
C = T0 - timedelta(seconds=3)


def _diag(extra: list[dict], *, with_checkpoint: bool = True):
    recs = [*training(ranks=8, with_checkpoint=with_checkpoint), *extra]
    return diagnose(snap(recs, nodes=heartbeats(8, NOW)), NOW)


def test_it_restores_from_the_newest_committed_checkpoint_not_the_newest_directory() -> None:
    d = _diag([checkpoint(C, "ckpt-118", 118, "staging")])
    assert d.checkpoint == "ckpt-100" and d.findings == ()


def test_it_prefers_a_newer_committed_checkpoint() -> None:
    d = _diag(
        [checkpoint(C, "ckpt-118", 118, "written"), checkpoint(C, "ckpt-118", 118, "committed")]
    )
    assert d.checkpoint == "ckpt-118"


def test_it_calls_a_commit_whose_shards_do_not_add_up_partial() -> None:
    bad = {"shards": [{"path": "a", "bytes": 10, "sha256": "x"}], "total_bytes": 40}
    d = _diag([checkpoint(C, "ckpt-118", 118, "committed", manifest=bad)])
    (p,) = of_kind(d, "checkpoint_partial")
    assert p.subject == "checkpoint:llama-70b/ckpt-118" and d.checkpoint == "ckpt-100"


def test_it_never_restores_from_a_corrupt_checkpoint() -> None:
    d = _diag(
        [
            checkpoint(C, "ckpt-118", 118, "committed"),
            checkpoint(C + timedelta(seconds=1), "ckpt-118", 118, "corrupt"),
        ]
    )
    assert of_kind(d, "checkpoint_corrupt") and d.checkpoint == "ckpt-100"


def test_it_reports_a_shard_written_but_missing_from_the_commit() -> None:
    d = _diag(
        [
            checkpoint(C, "ckpt-118", 118, "written", shards=4),
            checkpoint(C + timedelta(seconds=1), "ckpt-118", 118, "committed", shards=3),
        ]
    )
    (m,) = of_kind(d, "checkpoint_missing_shard")
    assert m.evidence["missing"] == ["ckpt-118/shard-3.pt"]


def test_it_reports_a_committed_checkpoint_changed_afterwards() -> None:
    changed = {
        "shards": [{"path": "ckpt-100/shard-0.pt", "bytes": 1000, "sha256": "f" * 64}],
        "total_bytes": 1000,
    }
    d = _diag([checkpoint(C, "ckpt-100", 100, "verified", manifest=changed)])
    (m,) = of_kind(d, "checkpoint_modified")
    assert m.severity == "critical" and "ckpt-100/shard-1.pt" in m.evidence["changed"]


def test_it_blocks_auto_restart_without_a_valid_checkpoint() -> None:
    d = _diag([device_event(3, T0, "xid", 79)], with_checkpoint=False)
    (xid,) = of_kind(d, "xid")
    assert xid.recovery is not None and xid.recovery.auto_restart_safe is False
    assert "checkpoint" in xid.recovery.reason


def _unhashed(cid: str, sizes: tuple[int, ...] = (1000, 1000)) -> dict:
    shards = [{"path": f"{cid}/s{i}.distcp", "bytes": b} for i, b in enumerate(sizes)]
    return {"shards": shards, "total_bytes": sum(sizes), "format": "torch_dcp"}


def _hashed(cid: str, sizes: tuple[int, ...] = (1000, 1000)) -> dict:
    m = _unhashed(cid, sizes)
    for i, s in enumerate(m["shards"]):
        s["sha256"] = f"{i + 7:064x}"
    return m


def test_it_waits_for_checksums_before_trusting_a_dcp_commit() -> None:
    """Committed with sizes only: not partial, but not valid for restore until verified."""
    d = _diag([checkpoint(C, "ckpt-118", 118, "committed", manifest=_unhashed("ckpt-118"))])
    assert d.findings == ()
    assert d.checkpoint == "ckpt-100"


def test_it_trusts_a_dcp_commit_once_verified_and_does_not_call_that_a_modification() -> None:
    d = _diag(
        [
            checkpoint(C, "ckpt-118", 118, "committed", manifest=_unhashed("ckpt-118")),
            checkpoint(C + timedelta(seconds=1), "ckpt-118", 118, "verified",
                       manifest=_hashed("ckpt-118")),
        ]
    )  # fmt: skip
    assert d.findings == ()
    assert d.checkpoint == "ckpt-118"


def test_it_still_calls_a_size_change_after_commit_a_modification() -> None:
    d = _diag(
        [
            checkpoint(C, "ckpt-118", 118, "committed", manifest=_unhashed("ckpt-118")),
            checkpoint(C + timedelta(seconds=1), "ckpt-118", 118, "verified",
                       manifest=_hashed("ckpt-118", sizes=(1000, 512))),
        ]
    )  # fmt: skip
    assert [f.kind for f in d.findings] == ["checkpoint_modified"]
    assert d.checkpoint == "ckpt-100"


def test_it_believes_the_agent_when_it_reports_a_committed_checkpoint_changed() -> None:
    modified = checkpoint(C + timedelta(seconds=2), "ckpt-118", 118, "modified")
    modified["manifest"] = None
    modified["detail"] = "committed checkpoint changed: s1.distcp changed"
    d = _diag(
        [
            checkpoint(C, "ckpt-118", 118, "committed"),
            checkpoint(C + timedelta(seconds=1), "ckpt-118", 118, "verified"),
            modified,
        ]
    )
    (f,) = of_kind(d, "checkpoint_modified")
    assert "s1.distcp" in f.evidence["detail"]
    assert d.checkpoint == "ckpt-100"
