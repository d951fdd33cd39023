"""A scan that catches torch DCP mid-rename (`.metadata.tmp`) must not list the temp file
as a shard: the commit without it read as `checkpoint_missing_shard` (seen in the
telemetry_down drill on a loaded box)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.checkpoints import CheckpointWatcher, RootConfig

from .conftest import validate


def test_a_metadata_tmp_caught_mid_write_is_no_shard(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    ckpt = root / "step_000100"
    ckpt.mkdir(parents=True)
    (ckpt / "faultline.json").write_text(json.dumps({"group": "llama", "generation": 2}))
    got: list[dict[str, Any]] = []
    watcher = CheckpointWatcher([RootConfig(root)], got.append, state_dir=tmp_path / "st")
    (ckpt / "__0_0.distcp").write_bytes(b"a" * 1000)
    (ckpt / ".metadata.tmp").write_bytes(b"me")  # torch: written, then renamed
    watcher.scan()
    (ckpt / ".metadata.tmp").rename(ckpt / ".metadata")
    (ckpt / "COMMITTED").write_text("")
    watcher.scan()
    watcher.drain_verification()
    assert [r["phase"] for r in got] == ["staging", "committed", "verified"]
    listed = [{s["path"] for s in r["manifest"]["shards"]} for r in got]
    assert listed[0] == {"__0_0.distcp"}  # the staging scan: no .metadata.tmp
    assert all(paths == {"__0_0.distcp", ".metadata"} for paths in listed[1:])
    validate(got)
