"""Faultline's diagnosis engine: snapshots of one consistency group in, findings out.

Pure Python over frozen dataclasses: no Django, no I/O, no clock reads (the caller
passes `now`), deterministic. The database adapter builds a snapshot with
`build_snapshot` and calls `diagnose`; see docs/diagnosis.md for the rules.
"""

from __future__ import annotations

from console.diagnosis.config import DiagnosisConfig
from console.diagnosis.engine import RULES, Diagnosis, diagnose
from console.diagnosis.findings import (
    ROOT_CAUSE,
    SYMPTOM,
    UNDETERMINED,
    Finding,
    Recovery,
)
from console.diagnosis.goodput import Goodput
from console.diagnosis.snapshot import GroupSnapshot, RankState, build_snapshot

__all__ = [
    "ROOT_CAUSE",
    "RULES",
    "SYMPTOM",
    "UNDETERMINED",
    "Diagnosis",
    "DiagnosisConfig",
    "Finding",
    "Goodput",
    "GroupSnapshot",
    "RankState",
    "Recovery",
    "build_snapshot",
    "diagnose",
]
