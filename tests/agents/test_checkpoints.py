from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from agents.checkpoints import CheckpointWatcher, RootConfig

from .conftest import validate


def _watcher(tmp_path: Path, root: Path, **kw) -> tuple[CheckpointWatcher, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    watcher = CheckpointWatcher([RootConfig(root, **kw)], got.append, state_dir=tmp_path / "st")
    return watcher, got


def _phases(got: list[dict[str, Any]]) -> list[str]:
    return [r["phase"] for r in got]


def test_it_follows_a_torch_dcp_checkpoint_from_staging_to_verified(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    ckpt = root / "step_000100"
    ckpt.mkdir(parents=True)
    (ckpt / "faultline.json").write_text(json.dumps({"group": "llama", "generation": 2}))
    watcher, got = _watcher(tmp_path, root)
    (ckpt / "__0_0.distcp").write_bytes(b"a" * 1000)
    watcher.scan()
    (ckpt / "__1_0.distcp").write_bytes(b"b" * 1000)
    (ckpt / ".metadata").write_bytes(b"meta")
    watcher.scan()
    watcher.scan()  # sizes held still for a scan: committed
    watcher.drain_verification()
    assert _phases(got) == ["staging", "written", "committed", "verified"]
    committed = got[2]
    assert committed["step"] == 100 and committed["group"] == "llama"
    assert committed["manifest"]["format"] == "torch_dcp"
    assert committed["manifest"]["total_bytes"] == 2004
    verified = got[3]["manifest"]["shards"]
    assert {s["path"]: s["sha256"] for s in verified}["__0_0.distcp"] == hashlib.sha256(
        b"a" * 1000
    ).hexdigest()
    validate(got)


def _manifest_ckpt(root: Path, name: str, shards: dict[str, bytes], *, lie: str = "") -> Path:
    ckpt = root / name
    ckpt.mkdir(parents=True)
    listed = []
    for path, data in shards.items():
        (ckpt / path).write_bytes(data)
        digest = hashlib.sha256(b"tampered" if path == lie else data).hexdigest()
        listed.append({"path": path, "bytes": len(data), "sha256": digest})
    (ckpt / "manifest.json").write_text(json.dumps({"shards": listed}))
    return ckpt


def test_it_commits_a_manifest_checkpoint_only_with_the_marker(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    ckpt = _manifest_ckpt(root, "ckpt-7", {"model.bin": b"m" * 50, "optim.bin": b"o" * 70})
    watcher, got = _watcher(tmp_path, root, group="g", generation=1)
    watcher.scan()
    watcher.scan()
    assert _phases(got) == ["written"]
    (ckpt / "COMMITTED").touch()
    watcher.scan()
    watcher.drain_verification()
    assert _phases(got) == ["written", "committed", "verified"]
    assert got[1]["checkpoint_id"] == "ckpt-7" and got[1]["step"] == 7
    validate(got)


def test_it_carries_the_data_cursor_the_launcher_wrote_beside_the_checkpoint(
    tmp_path: Path,
) -> None:
    """`faultline.json`'s data_cursor rides on every phase; absent stays absent."""
    root = tmp_path / "ckpts"
    ckpt = _manifest_ckpt(root, "ckpt-9", {"model.bin": b"m" * 50})
    (ckpt / "faultline.json").write_text(
        json.dumps({"group": "g", "generation": 1, "step": 9, "data_cursor": 36864})
    )
    plain = _manifest_ckpt(root, "ckpt-10", {"model.bin": b"n" * 50})
    for d in (ckpt, plain):
        (d / "COMMITTED").touch()
    watcher, got = _watcher(tmp_path, root, group="g", generation=1)
    watcher.scan()
    watcher.drain_verification()
    mine = [r for r in got if r["checkpoint_id"] == "ckpt-9"]
    assert {r["phase"] for r in mine} >= {"committed", "verified"}
    assert all(r["data_cursor"] == 36864 for r in mine)
    assert all("data_cursor" not in r for r in got if r["checkpoint_id"] == "ckpt-10")
    validate(got)


def test_it_names_the_corrupt_shard(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    ckpt = _manifest_ckpt(root, "ckpt-8", {"a.bin": b"1" * 10, "b.bin": b"2" * 10}, lie="b.bin")
    (ckpt / "COMMITTED").touch()
    watcher, got = _watcher(tmp_path, root, group="g", generation=1)
    watcher.scan()
    watcher.drain_verification()
    assert _phases(got) == ["committed", "corrupt"]
    assert got[-1]["detail"] == "shard b.bin: sha256 mismatch"
    validate(got)


def test_it_reports_a_missing_shard_as_corrupt(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    ckpt = _manifest_ckpt(root, "ckpt-9", {"a.bin": b"1" * 10, "b.bin": b"2" * 10})
    (ckpt / "a.bin").unlink()
    (ckpt / "COMMITTED").touch()
    watcher, got = _watcher(tmp_path, root, group="g", generation=1)
    watcher.scan()
    watcher.drain_verification()
    assert got[-1]["phase"] == "corrupt" and got[-1]["detail"] == "shard a.bin: missing"


def test_it_reports_modified_when_a_committed_checkpoint_changes(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    ckpt = _manifest_ckpt(root, "ckpt-10", {"a.bin": b"1" * 10})
    (ckpt / "COMMITTED").touch()
    watcher, got = _watcher(tmp_path, root, group="g", generation=1)
    watcher.scan()
    watcher.drain_verification()
    (ckpt / "a.bin").write_bytes(b"2" * 11)
    watcher.scan()
    watcher.scan()
    assert _phases(got) == ["committed", "verified", "modified"]
    assert "a.bin changed" in got[-1]["detail"]
    validate(got)


def test_it_does_not_report_a_committed_checkpoint_again_after_restart(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    ckpt = _manifest_ckpt(root, "ckpt-11", {"a.bin": b"1" * 10})
    (ckpt / "COMMITTED").touch()
    watcher, got = _watcher(tmp_path, root, group="g", generation=1)
    watcher.scan()
    watcher.drain_verification()
    again, got_again = _watcher(tmp_path, root, group="g", generation=1)
    again.scan()
    again.drain_verification()
    assert _phases(got) == ["committed", "verified"] and got_again == []


def test_it_skips_a_checkpoint_whose_group_is_unknown(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    _manifest_ckpt(root, "ckpt-12", {"a.bin": b"1"})
    watcher, got = _watcher(tmp_path, root)
    watcher.scan()
    assert got == []


def test_a_cursor_in_manifest_json_rides_on_the_record_not_in_the_manifest(
    tmp_path: Path,
) -> None:
    """One place on the wire: the record's `data_cursor`, whichever file the writer used."""
    root = tmp_path / "ckpts"
    ckpt = _manifest_ckpt(root, "ckpt-12", {"model.bin": b"m" * 50})
    listed = json.loads((ckpt / "manifest.json").read_text())
    (ckpt / "manifest.json").write_text(json.dumps({**listed, "data_cursor": 4096}))
    (ckpt / "COMMITTED").touch()
    watcher, got = _watcher(tmp_path, root, group="g", generation=1)
    watcher.scan()
    watcher.drain_verification()
    assert {r["phase"] for r in got} >= {"committed", "verified"}
    assert all(r["data_cursor"] == 4096 for r in got)
    assert all("data_cursor" not in r["manifest"] for r in got)
    validate(got)
