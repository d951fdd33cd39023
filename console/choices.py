"""Enumerations shared by the console's models, API and pages."""

from __future__ import annotations

from django.db import models


class GroupKind(models.TextChoices):
    TRAINING = "training"
    SERVING = "serving"
    UNKNOWN = "unknown"


class GroupState(models.TextChoices):
    INITIALIZING = "initializing"
    RUNNING = "running"
    QUIESCING = "quiescing"
    CHECKPOINTING = "checkpointing"
    RECOVERING = "recovering"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"


class Health(models.TextChoices):
    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    DOWN = "down"
    UNKNOWN = "unknown"


class Role(models.TextChoices):
    ROOT_CAUSE = "root_cause"
    SYMPTOM = "symptom"
    UNDETERMINED = "undetermined"


class Severity(models.TextChoices):
    CRITICAL = "critical"
    MAJOR = "major"
    MINOR = "minor"
    INFO = "info"


class IncidentState(models.TextChoices):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


class UserRole(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"
    ADMIN = "admin"


ROLE_ORDER = [UserRole.VIEWER, UserRole.OPERATOR, UserRole.APPROVER, UserRole.ADMIN]


# Action states in flight: approved, handed to the agent, or acknowledged by it. Ingest asks
# whether a node has any, so the common "none" answer costs nothing on the response path.
ACTION_LIVE_STATES = ("approved", "dispatched", "acknowledged")
