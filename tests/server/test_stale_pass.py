"""A diagnosis read before a restart committed judged a generation that has ended.

Found at 16k ranks (bench/detect.py): a pass that read the failed generation's stalled
ranks was written after the restart's transition, so its group_stall opened as an
incident of the *new* generation; the new generation's own stall, minutes later, then
had an open incident to fold into and nothing new was paged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console import actions
from console.diagnosis.engine import Diagnosis
from console.diagnosis.findings import ROOT_CAUSE, UNDETERMINED, make_finding
from console.diagnosis.goodput import Goodput
from console.models import Incident
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

GROUP, NODE = "stale-pass", "node-sp"
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _transition(post_batch, gen: int) -> None:
    rec = {"kind": "transition", "group": GROUP, "generation": gen, "to_state": "running",
           "world_size": 8}  # fmt: skip
    assert post_batch(make_batch([rec], node=NODE)).status_code == 202


def _stall(gen: int) -> Diagnosis:
    finding = make_finding(
        group=GROUP, generation=gen, kind="group_stall", subject=f"group:{GROUP}",
        role=UNDETERMINED, severity="critical", summary="stalled", first_seen=NOW,
    )  # fmt: skip
    return Diagnosis(GROUP, gen, NOW, (finding,), Goodput(60.0, 60.0))


def test_a_pass_of_an_ended_generation_opens_nothing_and_the_new_one_s_stall_pages(
    post_batch,
) -> None:
    _transition(post_batch, 1)
    _transition(post_batch, 2)  # the restart committed after the pass read generation 1
    assert actions.record_diagnosis(group_name=GROUP, diagnosis=_stall(1), now=NOW) == []
    assert not Incident.objects.filter(group__name=GROUP).exists()
    later = NOW + timedelta(seconds=30)
    (opened,) = actions.record_diagnosis(group_name=GROUP, diagnosis=_stall(2), now=later)
    incident = Incident.objects.get(pk=opened)
    assert (incident.kind, incident.generation) == ("group_stall", 2)


def test_an_urgent_located_root_cause_keeps_the_generation_it_was_judged_in(
    post_batch,
) -> None:
    """A GPU fault read just before the restart is still the GPU's (the urgent lane opens
    it), but it belongs to the generation it stopped, not to the one started after."""
    _transition(post_batch, 1)
    _transition(post_batch, 2)
    xid = make_finding(
        group=GROUP, generation=1, kind="xid", subject="gpu:G0", role=ROOT_CAUSE,
        severity="critical", summary="Xid 79 on G0", first_seen=NOW,
        evidence={"code": 79, "gpu": "G0"},
    )  # fmt: skip
    diagnosis = Diagnosis(GROUP, 1, NOW, (xid,), Goodput(60.0, 60.0))
    (opened,) = actions.record_located(
        group_name=GROUP, diagnosis=diagnosis, subjects=frozenset({"gpu:G0"}), now=NOW
    )
    assert Incident.objects.get(pk=opened).generation == 1
