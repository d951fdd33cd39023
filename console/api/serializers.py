"""Read serializers for the management API (not used on the ingest hot path)."""

from __future__ import annotations

from rest_framework import serializers

from console.models import Alert, ConsistencyGroup, Device, Incident, Node
from console.queries import telemetry


class NodeSerializer(serializers.ModelSerializer):
    gpus = serializers.IntegerField(source="gpu_count", read_only=True)

    class Meta:
        model = Node
        fields = [
            "name", "pool", "labels", "health", "agent_version", "first_seen", "last_seen",
            "quarantined", "cordoned", "gpus",
        ]  # fmt: skip


class DeviceSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")

    class Meta:
        model = Device
        fields = ["uuid", "node", "index", "health", "last_seen", "isolated", "last_sample"]


class AgentSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")
    gaps = serializers.IntegerField()

    class Meta:
        model = telemetry.AgentState
        fields = [
            "agent_id", "node", "version", "last_seq", "batches", "records", "duplicates",
            "gaps", "gap_ranges", "last_seen", "clock_skew_ms", "spool_depth", "dropped",
        ]  # fmt: skip


class GroupSerializer(serializers.ModelSerializer):
    open_incidents = serializers.IntegerField(read_only=True, default=0)
    goodput = serializers.SerializerMethodField()
    tail_ratio = serializers.SerializerMethodField()
    newest_valid_checkpoint = serializers.SerializerMethodField()
    recovery_advice = serializers.SerializerMethodField()

    class Meta:
        model = ConsistencyGroup
        fields = [
            "name", "kind", "state", "generation", "restart_count", "world_size", "topology",
            "data_cursor", "model_version", "labels", "state_since", "last_activity",
            "open_incidents", "goodput", "tail_ratio", "newest_valid_checkpoint",
            "recovery_advice",
        ]  # fmt: skip

    def get_goodput(self, obj: ConsistencyGroup) -> dict | None:
        return obj.summary.get("goodput")

    def get_tail_ratio(self, obj: ConsistencyGroup) -> float | None:
        return obj.summary.get("tail_ratio")

    def get_newest_valid_checkpoint(self, obj: ConsistencyGroup) -> str | None:
        return obj.summary.get("newest_valid_checkpoint")

    def get_recovery_advice(self, obj: ConsistencyGroup) -> dict | None:
        return obj.summary.get("recovery_advice")


class AlertSerializer(serializers.ModelSerializer):
    incident = serializers.IntegerField(source="incident_id")
    group = serializers.CharField(source="incident.group.name", default=None)

    class Meta:
        model = Alert
        fields = [
            "finding_id", "incident", "group", "kind", "subject", "role", "severity", "summary",
            "caused_by", "evidence", "first_seen", "last_seen", "active",
        ]  # fmt: skip


class IncidentSerializer(serializers.ModelSerializer):
    group = serializers.CharField(source="group.name", default=None)
    symptoms = serializers.SerializerMethodField()

    class Meta:
        model = Incident
        fields = [
            "id", "group", "generation", "state", "kind", "subject", "role", "severity",
            "summary", "root_cause", "symptom_count", "symptoms", "recovery", "timeline",
            "opened_at", "resolved_at", "version",
        ]  # fmt: skip

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
