"""Read serializers for the management API (not used on the ingest hot path)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import serializers

from console.models import Alert, ConsistencyGroup, Device, HealthEvent, Incident, Node
from console.queries import launcher, recovery
from console.queries import objectives as group_objectives
from console.queries.telemetry import agent_state
from console.serving import serving_state_of

LIFECYCLE_FIELDS = (
    "lifecycle",
    "lifecycle_reason",
    "lifecycle_evidence",
    "lifecycle_since",
    "lifecycle_by",
    "repair_needed",
    "taken_out_by",
    "replace_flagged",
)


class HealthEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = HealthEvent
        fields = ["at", "gpu", "kind", "before", "after", "reason", "actor", "evidence"]


class NodeSerializer(serializers.ModelSerializer):
    gpus = serializers.IntegerField(source="gpu_count", read_only=True)

    class Meta:
        model = Node
        fields = [
            "name",
            "pool",
            "labels",
            "health",
            "agent_version",
            "first_seen",
            "last_seen",
            "delivery_delay_s",
            "quarantined",
            "cordoned",
            "gpus",
            *LIFECYCLE_FIELDS,
        ]


class DeviceSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")

    class Meta:
        model = Device
        fields = [
            "uuid",
            "node",
            "index",
            "health",
            "last_seen",
            "isolated",
            "last_sample",
            *LIFECYCLE_FIELDS,
        ]


class NodeDetailSerializer(NodeSerializer):
    """One node with its GPUs, its fault history (newest first) and its incidents."""

    devices = DeviceSerializer(many=True, read_only=True)
    history = serializers.SerializerMethodField()
    incidents = serializers.SerializerMethodField()

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "devices", "history", "incidents"]

    def get_history(self, node: Node) -> list[dict[str, Any]]:
        rows = node.health_events.order_by("-at", "-id")[:200]
        return list(HealthEventSerializer(rows, many=True).data)

    def get_incidents(self, node: Node) -> list[dict[str, Any]]:
        own = list(node.incidents.order_by("-opened_at")[:50])
        linked = Incident.objects.filter(root_incident__in=own).select_related("group")
        return [
            {
                "id": i.pk,
                "scope": "node" if i.group_id is None else "group",
                "group": i.group.name if i.group else None,
                "root_incident": i.root_incident_id,
                "state": i.state,
                "kind": i.kind,
                "subject": i.subject,
                "severity": i.severity,
                "summary": i.summary,
                "opened_at": i.opened_at,
                "resolved_at": i.resolved_at,
            }
            for i in [*own, *linked]
        ]


class AgentSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")
    gaps = serializers.IntegerField()

    class Meta:
        model = agent_state.AgentState
        fields = [
            "agent_id",
            "node",
            "version",
            "last_seq",
            "batches",
            "records",
            "duplicates",
            "gaps",
            "gap_ranges",
            "last_seen",
            "clock_skew_ms",
            "spool_depth",
            "dropped",
        ]


class GroupSerializer(serializers.ModelSerializer):
    open_incidents = serializers.IntegerField(read_only=True, default=0)
    goodput = serializers.SerializerMethodField()
    tail_ratio = serializers.SerializerMethodField()
    newest_valid_checkpoint = serializers.SerializerMethodField()
    recovery_advice = serializers.SerializerMethodField()
    serving_state = serializers.SerializerMethodField()

    class Meta:
        model = ConsistencyGroup
        fields = [
            "name",
            "kind",
            "state",
            "generation",
            "restart_count",
            "world_size",
            "topology",
            "data_cursor",
            "model_version",
            "labels",
            "state_since",
            "last_activity",
            "open_incidents",
            "goodput",
            "tail_ratio",
            "newest_valid_checkpoint",
            "recovery_advice",
            "serving_state",
        ]

    def get_goodput(self, obj: ConsistencyGroup) -> dict | None:
        return obj.summary.get("goodput")

    def get_tail_ratio(self, obj: ConsistencyGroup) -> float | None:
        return obj.summary.get("tail_ratio")

    def get_newest_valid_checkpoint(self, obj: ConsistencyGroup) -> str | None:
        return obj.summary.get("newest_valid_checkpoint")

    def get_recovery_advice(self, obj: ConsistencyGroup) -> dict | None:
        return obj.summary.get("recovery_advice")

    def get_serving_state(self, obj: ConsistencyGroup) -> dict | None:
        """A serving group's state (serving, degraded, down, initializing), its reason
        and worker counts; null for training groups."""
        return serving_state_of(obj)


class GroupDetailSerializer(GroupSerializer):
    """One group: adds its recovery objectives (with sources) and the checkpoint-interval
    and hot-spare advice; not in the list, where it would cost a query per row."""

    objectives = serializers.SerializerMethodField()
    checkpoint_advice = serializers.SerializerMethodField()
    utilisation = serializers.SerializerMethodField()

    class Meta(GroupSerializer.Meta):
        fields = [*GroupSerializer.Meta.fields, "objectives", "checkpoint_advice", "utilisation"]

    def _both(self, obj: ConsistencyGroup) -> dict[str, Any]:
        """Both fields from one read (the serializer lives for one response)."""
        memo: dict[int, dict[str, Any]] = self.__dict__.setdefault("_objectives_memo", {})
        if obj.pk not in memo:
            memo[obj.pk] = group_objectives.objectives_and_advice(obj, now=timezone.now())
        return memo[obj.pk]

    def get_objectives(self, obj: ConsistencyGroup) -> dict:
        objectives: dict = self._both(obj)["objectives"]
        return objectives

    def get_checkpoint_advice(self, obj: ConsistencyGroup) -> dict:
        advice: dict = self._both(obj)["advice"]
        return advice

    def get_utilisation(self, obj: ConsistencyGroup) -> dict | None:
        """A training group's MFU and HFU (ratios; null when absent, with the reasons),
        per rank (the lowest first kept) with HBM utilisation and the node's NIC
        throughput; null before a diagnosis or for a serving group."""
        return obj.summary.get("utilisation")


class AlertSerializer(serializers.ModelSerializer):
    incident = serializers.IntegerField(source="incident_id")
    group = serializers.CharField(source="incident.group.name", default=None)

    class Meta:
        model = Alert
        fields = [
            "finding_id",
            "incident",
            "group",
            "kind",
            "subject",
            "role",
            "severity",
            "summary",
            "caused_by",
            "evidence",
            "first_seen",
            "last_seen",
            "active",
        ]


class IncidentSerializer(serializers.ModelSerializer):
    group = serializers.CharField(source="group.name", default=None)
    node = serializers.CharField(source="node.name", default=None, allow_null=True)
    symptoms = serializers.SerializerMethodField()
    external_alerts = serializers.SerializerMethodField()
    costs = serializers.SerializerMethodField()
    verdict = serializers.SerializerMethodField()
    settles_at = serializers.DateTimeField(read_only=True)
    launcher_root_cause = serializers.SerializerMethodField()

    class Meta:
        model = Incident
        fields = [
            "id",
            "group",
            "node",
            "generation",
            "state",
            "kind",
            "subject",
            "role",
            "severity",
            "summary",
            "root_cause",
            "symptom_count",
            "symptoms",
            "external_alerts",
            "recovery",
            "costs",
            "launcher_root_cause",
            "timeline",
            "opened_at",
            "resolved_at",
            "version",
            "verdict",
            "settles_at",
        ]

    def get_verdict(self, obj: Incident) -> str:
        """`provisional` while the root cause may still be revised (until `settles_at`),
        then `settled`: remediation is proposed only from a settled verdict."""
        return "settled" if obj.verdict_settled(timezone.now()) else "provisional"

    def get_launcher_root_cause(self, obj: Incident) -> dict[str, Any] | None:
        """The root cause the group's launcher named for this generation (torchrun's first
        observed failure), and whether it is the rank Faultline names (console.queries.
        launcher). A list reads them for its whole page at once (IncidentList)."""
        known = self.context.get("launcher_root_causes")
        if known is not None:
            return known.get(obj.pk)
        return launcher.launcher_root_cause(obj)

    def get_costs(self, obj: Incident) -> dict[str, Any] | None:
        """The seed's recovery costs (console.queries.recovery): measured live on the
        detail endpoint until final; the list shows what the pipeline stored."""
        if self.context.get("live_costs"):
            return recovery.costs_of(obj)
        return obj.costs or None

    def get_external_alerts(self, obj: Incident) -> list[dict]:
        """The Alertmanager alerts filed on this incident (console.actions.alertmanager)."""
        return [
            {
                "name": a.name,
                "status": a.status,
                "severity": a.severity,
                "summary": a.summary,
                "fingerprint": a.fingerprint,
                "gpu": a.gpu,
                "xid": a.xid,
                "joined": a.joined,
                "labels": a.labels,
                "starts_at": a.starts_at,
                "ends_at": a.ends_at,
                "resolved_at": a.resolved_at,
            }
            for a in obj.external_alerts.all()
        ]

    def get_symptoms(self, obj: Incident) -> list[dict]:
        limit = self.context.get("symptom_limit", 50)
        rows = [a for a in obj.alerts.all() if a.role == "symptom"][:limit]
        return [
            {
                "kind": a.kind,
                "subject": a.subject,
                "severity": a.severity,
                "summary": a.summary,
                "active": a.active,
                "caused_by": a.caused_by,
                "suppressed_because": f"explained by root cause {obj.kind} on {obj.subject}",
            }
            for a in rows
        ]
