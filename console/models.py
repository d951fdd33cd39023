"""The console's state: fleet inventory, consistency groups, findings and incidents.

Models hold fields and invariants only; every change goes through console.actions.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from console.choices import (
    GroupKind,
    GroupState,
    Health,
    IncidentState,
    Role,
    Severity,
    UserRole,
)


class Node(models.Model):
    """A host that runs an agent; created by its first token or its first batch."""

    name = models.CharField(max_length=128, unique=True)
    pool = models.CharField(max_length=64, blank=True, default="")
    labels = models.JSONField(default=dict, blank=True)
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    agent_version = models.CharField(max_length=32, blank=True, default="")
    first_seen = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    quarantined = models.BooleanField(default=False)
    cordoned = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Device(models.Model):
    """One GPU, keyed by its UUID; `last_sample` holds the newest device_sample fields."""

    uuid = models.CharField(max_length=96, unique=True)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveIntegerField()
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    last_sample = models.JSONField(default=dict, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    isolated = models.BooleanField(default=False)

    class Meta:
        ordering = ["node__name", "index"]
        indexes = [models.Index(fields=["node", "index"])]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class ConsistencyGroup(models.Model):
    """A training job or serving deployment whose members fail and recover together.

    `generation` is the one active generation (fencing): only a `transition` record moves
    it forward; records of older generations are stored and flagged, never applied.
    """

    name = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=16, choices=GroupKind.choices, default=GroupKind.UNKNOWN)
    state = models.CharField(
        max_length=16, choices=GroupState.choices, default=GroupState.INITIALIZING
    )
    generation = models.PositiveIntegerField(default=0)
    restart_count = models.PositiveIntegerField(default=0)
    world_size = models.PositiveIntegerField(null=True, blank=True)
    topology = models.JSONField(default=dict, blank=True)
    data_cursor = models.BigIntegerField(null=True, blank=True)
    model_version = models.CharField(max_length=128, blank=True, default="")
    last_checkpoint_step = models.BigIntegerField(null=True, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    state_since = models.DateTimeField(null=True, blank=True)
    last_activity = models.DateTimeField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)  # newest diagnosis: goodput, advice
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Rank(models.Model):
    """One member of a group: a training rank or a serving worker."""

    group = models.ForeignKey(ConsistencyGroup, on_delete=models.CASCADE, related_name="ranks")
    rank = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True)
    gpu = models.CharField(max_length=96, blank=True, default="")
    generation = models.PositiveIntegerField(default=0)
    last_step = models.BigIntegerField(null=True, blank=True)
    last_step_at = models.DateTimeField(null=True, blank=True)
    data_cursor = models.BigIntegerField(null=True, blank=True)
    process_state = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        ordering = ["group", "rank"]
        constraints = [models.UniqueConstraint(fields=["group", "rank"], name="rank_unique")]

    def __str__(self) -> str:
        return f"{self.group.name}/{self.rank}"


class Incident(models.Model):
    """One root cause (or undetermined cluster) with its symptoms, in one group generation.

    The database allows one open incident per (group, fingerprint): re-diagnosis updates
    it instead of paging again.
    """

    group = models.ForeignKey(
        ConsistencyGroup, on_delete=models.CASCADE, related_name="incidents", null=True
    )
    generation = models.PositiveIntegerField(default=0)
    fingerprint = models.CharField(max_length=128)
    state = models.CharField(
        max_length=16, choices=IncidentState.choices, default=IncidentState.OPEN
    )
    kind = models.CharField(max_length=48)
    subject = models.CharField(max_length=256)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.ROOT_CAUSE)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    summary = models.CharField(max_length=512)
    root_cause = models.JSONField(default=dict)
    symptom_count = models.PositiveIntegerField(default=0)
    recovery = models.JSONField(default=dict, blank=True)
    timeline = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)
    clear_since = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="assigned_incidents",
    )
    version = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["-opened_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["group", "fingerprint"],
                condition=~Q(state="resolved"),
                name="one_open_incident_per_fingerprint",
            )
        ]
        indexes = [models.Index(fields=["state", "-opened_at"])]

    def __str__(self) -> str:
        return f"#{self.pk} {self.summary}"


class Alert(models.Model):
    """A finding from diagnosis, filed under its incident; symptoms say why they are folded."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="alerts")
    finding_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=48)
    subject = models.CharField(max_length=256)
    role = models.CharField(max_length=16, choices=Role.choices)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    summary = models.CharField(max_length=512, blank=True, default="")
    caused_by = models.JSONField(default=list, blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["incident", "role", "subject"]
        constraints = [
            models.UniqueConstraint(fields=["incident", "finding_id"], name="alert_unique")
        ]
        indexes = [models.Index(fields=["role", "active"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}"


class IncidentComment(models.Model):
    """A note on an incident by a person; never edited, shown on the timeline."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="comments")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    body = models.TextField(max_length=4000)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created"]

    def __str__(self) -> str:
        return f"comment on #{self.incident_id} by {self.author_id}"


class Membership(models.Model):
    """A console user's role; users without one are viewers."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership"
    )
    role = models.CharField(max_length=16, choices=UserRole.choices, default=UserRole.VIEWER)

    def __str__(self) -> str:
        return f"{self.user} ({self.role})"
