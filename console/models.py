"""The console's state: fleet inventory, consistency groups, findings and incidents.

Models hold fields and invariants only; every change goes through console.actions.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q

from agents.wire import MAX_SEND_INTERVAL_S
from console.choices import (
    ACTION_KINDS,
    ACTION_STATES,
    LIFECYCLE_STATES,
    REPAIR_KINDS,
    TAKEN_OUT_BY,
    GroupKind,
    GroupState,
    Health,
    IncidentState,
    Role,
    Severity,
    UserRole,
)


class Lifecycle(models.Model):
    """The latched health lifecycle of a node or a GPU (console.policy.fleet_health).

    `health` is what the newest sample says; `lifecycle` is what the hardware has been
    through and only evidence of repair moves back. Written by console.actions.fleet.
    """

    lifecycle = models.CharField(
        max_length=16, choices=LIFECYCLE_STATES, default="healthy", db_default="healthy"
    )
    lifecycle_reason = models.CharField(max_length=512, blank=True, default="", db_default="")
    # the record that raised it
    lifecycle_evidence = models.JSONField(default=dict, blank=True, db_default={})
    lifecycle_since = models.DateTimeField(null=True, blank=True)
    lifecycle_by = models.CharField(max_length=160, blank=True, default="", db_default="")
    repair_needed = models.CharField(
        max_length=16, choices=REPAIR_KINDS, blank=True, default="", db_default=""
    )
    taken_out_by = models.CharField(
        max_length=16, choices=TAKEN_OUT_BY, blank=True, default="", db_default=""
    )
    replace_flagged = models.BooleanField(default=False, db_default=False)  # repeat offender: RMA

    class Meta:
        abstract = True


class Node(Lifecycle):
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
    # How late the node's data arrives: the newest stored batch's delivery delay (its oldest
    # sample's age when it was stored) and the newest DELAYS_KEPT of them, oldest first.
    # Written by ingest with the batch (ingest.store.delivery), read by console.delivery.
    delivery_delay_s = models.FloatField(null=True, blank=True)
    delivery_delays = models.JSONField(default=list, db_default=[], blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Device(Lifecycle):
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


class HealthEvent(models.Model):
    """One entry of a node's fault history: a fault, a repair, a move of its lifecycle.

    Written with its audit row by console.actions.fleet; `gpu` is blank for the node.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_events")
    gpu = models.CharField(max_length=96, blank=True, default="")
    kind = models.CharField(max_length=24)  # fault | repair | moved | flagged | returned
    before = models.CharField(max_length=16, blank=True, default="")
    after = models.CharField(max_length=16, blank=True, default="")
    reason = models.CharField(max_length=512, blank=True, default="")
    evidence = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=160)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["node", "-at"])]

    def __str__(self) -> str:
        return f"{self.node_id} {self.kind} {self.after}"


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
    # The scheduler's job id (Slurm job id) as the launcher or a rank reported it.
    scheduler_job = models.CharField(max_length=128, blank=True, default="")
    last_checkpoint_step = models.BigIntegerField(null=True, blank=True)
    # Serving SLO overrides (ttft_ms_p99, tpot_ms_p99, e2e_ms_p99, goodput_target); the
    # defaults live in console.diagnosis.records.ServingSlo.
    slo = models.JSONField(default=dict, blank=True)
    # Recovery objectives by who declared them: {"launcher": {...}, "operator":
    # {...}}, keys agents.protocol.OBJECTIVE_KEYS; pool defaults come from settings.
    # console.queries.objectives merges them (operator > launcher > pool > default).
    objectives = models.JSONField(default=dict, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    state_since = models.DateTimeField(null=True, blank=True)
    last_activity = models.DateTimeField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)  # newest diagnosis: goodput, advice
    created = models.DateTimeField(auto_now_add=True)
    # The node whose batch created the group (ingest). Until a rank is placed it is the only
    # node (besides the group's launcher token) that may transition the group: a group with
    # no placement to check against must not be fenced by any token (docs/security.md).
    created_by = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Who owns the group (ingest.ownership, docs/security.md "Who owns a group"): the
    # scheduler job whose nodes' agents attest it ('' = none: the nodes of its first
    # generation's rendezvous, ingest.GroupMember), and until when that rendezvous takes
    # new nodes (NULL: no rank placed yet).
    owner_job = models.CharField(max_length=128, blank=True, default="")
    rendezvous_until = models.DateTimeField(null=True, blank=True)
    # The generation moves of the current hour: how far it moved since `..._start`.
    generation_window_start = models.DateTimeField(null=True, blank=True)
    generation_window_advance = models.PositiveIntegerField(default=0)

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


# An incident's verdict (its root cause) is provisional this long after it opened: every
# node's records of the moment have arrived by then (an agent sends at least this often),
# and a pass may still revise the root cause. Proposals wait for the settled verdict;
# pages do not (docs/diagnosis.md, "Ordering").
VERDICT_SETTLES_AFTER = timedelta(seconds=MAX_SEND_INTERVAL_S)


class Incident(models.Model):
    """One root cause (or undetermined cluster) with its symptoms, in one group generation.

    The database allows one open incident per (group, fingerprint): re-diagnosis updates
    it instead of paging again. Its verdict is provisional until `settles_at`
    (`verdict_settled`): the one predicate every caller that acts on a verdict asks.
    """

    group = models.ForeignKey(
        ConsistencyGroup, on_delete=models.CASCADE, related_name="incidents", null=True
    )
    # A fleet-scope incident (a hardware fault) has a node and no group.
    node = models.ForeignKey(
        Node, on_delete=models.CASCADE, related_name="incidents", null=True, blank=True
    )
    # A group incident whose root cause is a node's fault names that node's incident: it
    # links, it does not own it (resolving the group's leaves the node's open).
    root_incident = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="caused"
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
    # The seed's recovery costs (console.diagnosis.recovery_costs), measured from the
    # incident's records once it resolved; written by console.actions.recovery.
    costs = models.JSONField(default=dict, blank=True, db_default={})
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
            ),
            models.UniqueConstraint(
                fields=["node", "fingerprint"],
                condition=~Q(state="resolved") & Q(group__isnull=True),
                name="one_open_node_incident_per_fingerprint",
            ),
        ]
        indexes = [models.Index(fields=["state", "-opened_at"])]

    def __str__(self) -> str:
        return f"#{self.pk} {self.summary}"

    @property
    def settles_at(self) -> datetime:
        """When the verdict stops being revisable: VERDICT_SETTLES_AFTER after it opened. A
        node's own incident (no group) is opened from that node's evidence alone and no
        group pass revises it: settled as it opens."""
        if self.group_id is None:
            return self.opened_at
        return self.opened_at + VERDICT_SETTLES_AFTER

    def verdict_settled(self, now: datetime) -> bool:
        """True once the root cause may no longer be revised: act on it (remediation
        proposals) only then. Pages go out before (an incident opens as fast as the
        evidence allows)."""
        return now >= self.settles_at

    @staticmethod
    def settled_at(now: datetime) -> Q:
        """`verdict_settled(now)` as a filter, for querysets of incidents."""
        return Q(group__isnull=True) | Q(opened_at__lte=now - VERDICT_SETTLES_AFTER)


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


# --- Remediation: actions, votes, audit, breaker, silences, escalation --------------------
# Written only through console.actions (remediation, paging, notifications); the
# rules they store come from the pure gates in console.policy.


class Action(models.Model):
    """A remediation proposed by a person or a rule, gated by console.policy.

    `generation` is the target group's generation when it was decided: dispatch refuses
    it once the group moved on. `gate_reasons` and `preview` keep what the gates and the
    dry run said at proposal, so approvers see the blast radius before they vote.
    """

    kind = models.CharField(max_length=32, choices=ACTION_KINDS)
    target = models.CharField(max_length=256)
    node = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="actions"
    )
    # The agent that runs it when not `node`'s own: the pool's controller agent for a node
    # whose agent is silent (docs/safety.md, "Who runs a proposal"). Null: `node` runs it.
    executor = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="executing"
    )
    gpu = models.CharField(max_length=96, blank=True, default="")
    group = models.ForeignKey(
        ConsistencyGroup, on_delete=models.SET_NULL, null=True, blank=True, related_name="actions"
    )
    generation = models.PositiveIntegerField(null=True, blank=True)
    reason = models.TextField(max_length=2000)
    evidence = models.JSONField(default=dict, blank=True)
    incident = models.ForeignKey(
        Incident, on_delete=models.SET_NULL, null=True, blank=True, related_name="actions"
    )
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="proposed_actions",
    )
    proposed_by_rule = models.CharField(max_length=128, blank=True, default="")
    trigger = models.CharField(max_length=64, blank=True, default="")
    state = models.CharField(max_length=16, choices=ACTION_STATES, default="proposed")
    approvals_required = models.PositiveSmallIntegerField(default=1)
    gate_reasons = models.JSONField(default=list, blank=True)
    preview = models.JSONField(default=list, blank=True)
    escalated = models.BooleanField(default=False)
    dry_run = models.BooleanField(default=False)
    params = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    # The agent's structured outcome (agents/actions_contract.Outcome): applied, already,
    # held_by_other, refused...; `taken_out_by` in it is who holds the node.
    outcome = models.JSONField(default=dict, blank=True, db_default={})
    proposed_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-proposed_at", "-id"]
        indexes = [
            models.Index(fields=["node", "state"]),
            models.Index(fields=["executor", "state"]),
            models.Index(fields=["state", "-proposed_at"]),
        ]
        constraints = [
            # Every action has an author: a person or a named automation rule.
            models.CheckConstraint(
                condition=Q(proposed_by__isnull=False) | ~Q(proposed_by_rule=""),
                name="action_has_proposer",
            )
        ]

    def __str__(self) -> str:
        return f"action {self.pk} {self.kind} {self.target} ({self.state})"


class Vote(models.Model):
    """One approver's decision on one action; the database allows one per user."""

    action = models.ForeignKey(Action, on_delete=models.PROTECT, related_name="votes")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    decision = models.CharField(
        max_length=8, choices=[("approve", "approve"), ("reject", "reject")]
    )
    generation = models.PositiveIntegerField(null=True, blank=True)
    reason = models.CharField(max_length=512, blank=True, default="")
    cast_at = models.DateTimeField()

    class Meta:
        ordering = ["cast_at", "id"]
        constraints = [models.UniqueConstraint(fields=["action", "user"], name="one_vote_per_user")]

    def __str__(self) -> str:
        return f"{self.decision} on {self.action_id} by {self.user_id}"


class AuditLog(models.Model):
    """Append-only record of every remediation change and gate decision.

    `actor` is a name, not a foreign key: deleting a user must never rewrite history,
    and a database trigger (migration 0004) refuses UPDATE and DELETE on this table.
    `chain_seq`, `prev_hash` and `hash` chain each row to the one before (console.auditchain),
    so an edit or deletion made past the trigger shows in `faultline audit verify`.
    """

    ts = models.DateTimeField()
    actor = models.CharField(max_length=150)
    verb = models.CharField(max_length=48)
    object_type = models.CharField(max_length=32)
    object_id = models.CharField(max_length=64, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    # Written by Postgres alone, when the row's transaction commits (a deferred trigger,
    # migration 0016): its place in the chain, the previous row's hash and its own.
    chain_seq = models.BigIntegerField(null=True, blank=True, unique=True)
    prev_hash = models.CharField(max_length=64, blank=True, db_default="")
    hash = models.CharField(max_length=64, blank=True, db_default="")

    class Meta:
        ordering = ["-ts", "-id"]
        indexes = [
            models.Index(fields=["verb", "-ts"]),
            models.Index(fields=["actor", "-ts"]),
            models.Index(fields=["object_type", "object_id"]),
        ]

    def __str__(self) -> str:
        return f"{self.ts:%Y-%m-%d %H:%M:%S} {self.actor} {self.verb} {self.object_type}"


class BreakerState(models.Model):
    """The automation circuit breaker: one row (pk 1); while open every action needs a human."""

    open = models.BooleanField(default=False)
    reason = models.TextField(blank=True, default="")
    opened_at = models.DateTimeField(null=True, blank=True)
    opened_by = models.CharField(max_length=150, blank=True, default="")
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.CharField(max_length=150, blank=True, default="")
    closed_reason = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="breaker_single_row")]

    def __str__(self) -> str:
        return "breaker open" if self.open else "breaker closed"


class Silence(models.Model):
    """Hold back pages whose subject/labels match every glob in `matchers`, for a bounded time."""

    matchers = models.JSONField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.CharField(max_length=512)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=models.F("starts_at")), name="silence_ends_after_start"
            ),
        ]

    def __str__(self) -> str:
        return f"silence {self.pk} {self.matchers}"


class EscalationPolicy(models.Model):
    """Who is paged, when: steps of channels; the first matching policy (by position) wins."""

    name = models.CharField(max_length=128, unique=True)
    position = models.PositiveIntegerField(default=100)
    severities = models.JSONField(default=list, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    steps = models.JSONField()
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "name"]
        verbose_name_plural = "escalation policies"

    def __str__(self) -> str:
        return self.name


class NotificationChannel(models.Model):
    """Where a step's channel name delivers: a webhook, a Slack webhook or PagerDuty."""

    name = models.CharField(max_length=64, unique=True)
    kind = models.CharField(
        max_length=16,
        choices=[("webhook", "webhook"), ("slack", "slack"), ("pagerduty", "pagerduty")],
    )
    url = models.URLField(max_length=512)
    # HMAC secret for webhooks, routing key for PagerDuty; never returned by the API.
    secret = models.CharField(max_length=256, blank=True, default="")
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class IncidentEscalation(models.Model):
    """The escalation policy frozen onto an incident when it opened, and what was scheduled.

    `sent` lists the due-step keys already enqueued (console.policy.escalation.due_steps
    reads it), so editing a policy never changes an open incident and a sweep never
    schedules a step twice.
    """

    incident = models.OneToOneField(Incident, on_delete=models.CASCADE, related_name="escalation")
    policy_name = models.CharField(max_length=128, blank=True, default="")
    snapshot = models.JSONField(default=dict, blank=True)
    sent = models.JSONField(default=list, blank=True)
    silenced_by = models.ForeignKey(Silence, on_delete=models.SET_NULL, null=True, blank=True)
    done = models.BooleanField(default=False)
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"escalation of incident {self.incident_id} ({self.policy_name})"


class NotificationDelivery(models.Model):
    """One (incident, step key, channel) delivery; unique so a redelivered task never re-pages."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="deliveries")
    key = models.CharField(max_length=64)
    channel = models.CharField(max_length=64)
    event = models.CharField(max_length=16)
    status = models.CharField(max_length=16, default="pending")
    attempts = models.PositiveIntegerField(default=0)
    detail = models.CharField(max_length=512, blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["incident", "id"]
        constraints = [
            models.UniqueConstraint(fields=["incident", "key", "channel"], name="delivery_once")
        ]

    def __str__(self) -> str:
        return f"{self.key} to {self.channel} for incident {self.incident_id}"


class ApiToken(models.Model):
    """A user's API token, stored as its SHA-256 only: the token itself is shown once.

    Anyone who reads this table (an admin, a backup, a replica) learns nothing they can act
    with: authentication hashes the presented token and looks the hash up. `prefix` is the
    token's first characters, enough to tell two tokens apart in a list, not to use one.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=64, blank=True, default="")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"token {self.prefix}… of user {self.user_id}"


class SsoIdentity(models.Model):
    """The console user an OpenID identity signs in as: keyed by (issuer, `sub`), the IdP's
    stable id for a person, never by a username or an email the person may change or share.

    One row per identity and one identity per user, so a person holds one account (one
    vote) whatever names they sign in under. Written only by faultline.sso at sign-in.
    """

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_once")
        ]

    def __str__(self) -> str:
        return f"{self.issuer} {self.subject} -> user {self.user_id}"


class ExternalAlert(models.Model):
    """An alert Alertmanager delivered (node-exporter, dcgm-exporter, a site's own rules),
    stored as evidence on the node (and GPU) or group its labels name.

    One row per Alertmanager fingerprint and start: a re-delivery updates it, a resolve
    marks it resolved. Written only by console.actions.alertmanager.
    """

    fingerprint = models.CharField(max_length=64)
    starts_at = models.DateTimeField()
    name = models.CharField(max_length=200)  # the alertname label
    status = models.CharField(max_length=16)  # firing | resolved
    severity = models.CharField(max_length=16, default="major")
    summary = models.CharField(max_length=512, blank=True, default="")
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    node = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="external_alerts"
    )
    gpu = models.CharField(max_length=96, blank=True, default="")  # the GPU's uuid
    group = models.ForeignKey(
        ConsistencyGroup,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="external_alerts",
    )
    xid = models.IntegerField(null=True, blank=True)
    incident = models.ForeignKey(
        Incident,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="external_alerts",
    )
    # How it met a known fault: "" (its own), "agent" (the agent's Xid on the same GPU
    # latched it first) or "alert" (another alert did).
    joined = models.CharField(max_length=16, blank=True, default="")
    received_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-starts_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["fingerprint", "starts_at"], name="external_alert_once")
        ]
        indexes = [models.Index(fields=["node", "status"])]

    def __str__(self) -> str:
        return f"{self.name} {self.status}"
