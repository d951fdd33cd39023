from __future__ import annotations

from console.diagnosis import diagnose
from tests.diagnosis.factory import GROUP, T0, snap


def _w(worker: str, **kw: object) -> dict:
    window = {"seconds": 60, "requests": 100, "slo_met": 100, "retries": 0, "duplicate_tokens": 0}
    window.update(kw.pop("window", {}))
    rec = {
        "kind": "serving",
        "ts": T0,
        "group": GROUP,
        "worker": worker,
        "model_version": "m2",
        "adapter_version": None,
        "kv_schema": "kv3",
        "ready": True,
        "draining": False,
        "window": window,
    }
    rec.update(kw)
    return rec


def _kinds(*windows: dict) -> list[str]:
    return [f.kind for f in diagnose(snap(list(windows)), T0).findings]


def test_it_raises_nothing_for_a_quiet_window() -> None:
    assert _kinds(_w("a", window={"requests": 0, "slo_met": 0}), _w("b")) == []


def test_it_reports_an_slo_breach() -> None:
    assert _kinds(_w("a", window={"slo_met": 80}), _w("b")) == ["slo_breach"]


def test_it_reports_ready_before_the_model_is_loaded() -> None:
    assert _kinds(_w("a", model_version=None, window={"requests": 0})) == ["ready_before_loaded"]


def test_it_reports_traffic_on_a_draining_worker() -> None:
    assert _kinds(_w("a", draining=True, ready=False), _w("b")) == ["drained_worker_traffic"]


def test_it_reports_a_worker_on_a_stale_version() -> None:
    assert _kinds(_w("a"), _w("b"), _w("c", kv_schema="kv2")) == ["stale_version"]


def test_it_reports_a_retry_storm() -> None:
    assert _kinds(_w("a", window={"retries": 60})) == ["retry_storm"]


def test_it_reports_duplicate_streamed_tokens() -> None:
    assert _kinds(_w("a", window={"duplicate_tokens": 3})) == ["duplicate_finish"]
