"""The receiver's token, and a node with one GPU in the inventory (posted by its agent)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import make_batch

TOKEN = "am-secret-token-1234567890"
NODE, GPU = "gpu-node-7", "GPU-7f3a-0003"


@pytest.fixture(autouse=True)
def token(settings: Any) -> None:
    settings.ALERTMANAGER_TOKEN = TOKEN


@pytest.fixture
def inventory(post_batch: Any) -> None:
    sample = {"kind": "device_sample", "gpu": GPU, "index": 3, "temp_c": 55.0}
    assert post_batch(make_batch([sample], node=NODE)).status_code == 202
