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


# -- worker_lost: the silence threshold follows the worker's own window cadence ---------------
def _lost(*windows: dict, at_s: float, nodes: dict | None = None) -> list:
    from datetime import timedelta

    now = T0 + timedelta(seconds=at_s)
    d = diagnose(snap(list(windows), now=now, nodes=nodes), now)
    return [f for f in d.findings if f.kind == "worker_lost"]


def _second(worker: str, at_s: float, **window: object) -> dict:
    from datetime import timedelta

    rec = _w(worker, window={"seconds": 1.0, "requests": 5, "slo_met": 5, "active": 3, **window})
    rec["ts"] = T0 + timedelta(seconds=at_s)
    rec["node"] = f"node-{worker}"
    return rec


def test_a_worker_with_1s_windows_is_lost_after_the_floor_not_after_30s() -> None:
    assert _lost(_second("a", 0), _second("b", 6), at_s=4.5) == []  # under the 5 s floor
    (f,) = _lost(_second("a", 0), _second("b", 6), at_s=6)
    assert f.subject.endswith("/a") and f.evidence["lost_requests"] == 3
    assert f.evidence["threshold_s"] == 5.0


def test_a_worker_slowed_by_load_stretches_its_own_threshold() -> None:
    # Its loop runs slow: windows measure 4 s, so 7 s without one is under 3 x 4 s.
    slow = _second("a", 0, seconds=4.0)
    assert _lost(slow, _second("b", 7), at_s=7) == []
    assert [f.subject for f in _lost(slow, _second("b", 13), at_s=13)] == [f"worker:{GROUP}/a"]


def test_a_worker_whose_agent_lags_is_not_lost() -> None:
    from datetime import timedelta

    # node-a's agent delivered up to t=0.5 (a backlog): judged there, not at the clock.
    nodes = {"node-a": T0 + timedelta(seconds=0.5), "node-b": T0 + timedelta(seconds=8)}
    assert _lost(_second("a", 0), _second("b", 8), at_s=8, nodes=nodes) == []


def test_an_exit_reported_by_the_launcher_names_the_worker_at_once() -> None:
    from datetime import timedelta

    exit_rec = _second("a", 0.2, exited=True, exit_code=137, active=2, queued=1, requests=0)
    exit_rec.update(ready=False)
    (f,) = _lost(_second("b", 0), exit_rec, at_s=0.4)
    assert f.subject.endswith("/a") and f.evidence["lost_requests"] == 3
    assert f.evidence["exit_code"] == 137 and "exited (code 137)" in f.summary
    # A drained worker that exits with nothing in flight stopped on purpose.
    drained = {**exit_rec, "draining": True, "window": {"seconds": 1.0, "exited": True}}
    assert _lost(_second("b", 0), drained, at_s=0.4) == []
    # Its next window after a restart supersedes the exit.
    back = _second("a", 3)
    back["ts"] = T0 + timedelta(seconds=3)
    assert _lost(_second("b", 3), back, at_s=3.2) == []
