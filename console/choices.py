"""Enumerations shared by the console's models, API and pages.

Django's `TextChoices` views of vocabularies. Where a pure package owns the vocabulary
(group states, health and severities in agents.vocab, roles in console.policy.roles,
action kinds in agents.actions_contract, action states in console.policy.lifecycle), the
choices here are built from it, never spelled a second time.
"""

from __future__ import annotations

from django.db import models

from agents import actions_contract as contract
from agents import vocab
from console.policy.fleet_health import HealthState, Repair, TakenOutBy
from console.policy.lifecycle import LIVE_STATES, ActionState
from console.policy.roles import Role as _Role


class GroupKind(models.TextChoices):
    TRAINING = "training"
    SERVING = "serving"
    UNKNOWN = "unknown"


class GroupState(models.TextChoices):
    INITIALIZING = vocab.INITIALIZING
    RUNNING = vocab.RUNNING
    QUIESCING = vocab.QUIESCING
    CHECKPOINTING = vocab.CHECKPOINTING
    RECOVERING = vocab.RECOVERING
    COMPLETED = vocab.COMPLETED
    FAILED = vocab.FAILED
    STOPPED = vocab.STOPPED


# The group has ended (agents.vocab's terminal subset), as model values.
TERMINAL_GROUP_STATES = tuple(
    GroupState(s) for s in vocab.GROUP_STATES if s in vocab.TERMINAL_GROUP_STATES
)


class Health(models.TextChoices):
    # The order of the choices is the migrations'; the health order is vocab.HEALTH_ORDER.
    OK = vocab.HEALTH_OK
    WARNING = vocab.HEALTH_WARNING
    CRITICAL = vocab.HEALTH_CRITICAL
    DOWN = vocab.HEALTH_DOWN
    UNKNOWN = vocab.HEALTH_UNKNOWN


LIFECYCLE_STATES = [(s.value, s.value.replace("_", " ")) for s in HealthState]
REPAIR_KINDS = [(r.value, r.value.replace("_", " ")) for r in Repair]
TAKEN_OUT_BY = [(t.value, t.value or "in service") for t in TakenOutBy]


class Role(models.TextChoices):
    ROOT_CAUSE = "root_cause"
    SYMPTOM = "symptom"
    UNDETERMINED = "undetermined"


class Severity(models.TextChoices):
    CRITICAL = vocab.SEVERITY_CRITICAL
    MAJOR = vocab.SEVERITY_MAJOR
    MINOR = vocab.SEVERITY_MINOR
    INFO = vocab.SEVERITY_INFO


class IncidentState(models.TextChoices):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


class UserRole(models.TextChoices):
    """A console user's role; the ladder and permissions are console.policy.roles'."""

    VIEWER = _Role.VIEWER.value
    OPERATOR = _Role.OPERATOR.value
    APPROVER = _Role.APPROVER.value
    ADMIN = _Role.ADMIN.value


# Model choices for Action.kind (each kind's spec names its label, agents/actions_contract)
# and Action.state; the labels are what the admin shows.
ACTION_KINDS = [(spec.name, spec.label) for spec in contract.SPECS.values()]
ACTION_STATES = [(s.value, s.value) for s in ActionState]

# Action states in flight: approved, handed to the agent, or acknowledged by it. Ingest asks
# whether a node has any, so the common "none" answer costs nothing on the response path.
ACTION_LIVE_STATES = tuple(s.value for s in LIVE_STATES)
