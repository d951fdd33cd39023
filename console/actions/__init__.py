"""The only write path for console state. Every change of an incident, an action, a vote,
a node, a GPU, the breaker or the paging configuration is one of these verbs.

Each verb is keyword-only, takes `actor=` (a user, or the name of the system part that
acts) and writes it to an audit entry, runs in `transaction.atomic`, and publishes live
events (console.events) and enqueues tasks (console.scheduling) only on commit. Callers
import this package (`from console import actions`); the submodules import each other,
never this package, so the package has no import cycles:

    audit, errors        the audit log writer; the refusals every verb raises
    accounts             users the CLI creates; the role an SSO identity holds, set at
                         each sign-in; an admin's edits of users and roles (the admin site)
    tokens               user API tokens issued and revoked
    incidents            acknowledge, assign, comment (people)
    diagnosis            findings folded into incidents, settle and reopen (the engine)
    groups               a group's serving SLO overrides and recovery objectives
    fleet                nodes registered for an agent token, node health,
                         quarantine/cordon marks, GPU isolation, the health
                         lifecycle (latched faults, conditions, repair evidence, return)
    conditions           a node's NIC down and full disk: opened from ingest, settled
    gating, targets      inputs of the pure gates, read under the remediation lock; which
                         agent runs an action (the node's own, or a controller agent)
    remediation          propose, vote, cancel, withdraw, expire, abandon, dispatch, the
                         agent's result
    returns              validated hardware proposed for return to service (the sweep)
    proposals            the remediation policy's proposals and withdrawals, for group
                         incidents and for node incidents (the sweep)
    breaker              the automation circuit breaker
    paging               silences, escalation policies, notification channels
    alertmanager         Alertmanager's alerts as evidence, node incidents and GPU faults
    notifications        which pages are due; each delivered at most once

It must not read telemetry (console.queries, console.snapshots) beyond what a decision
needs, render anything, or import views, tasks or ingest.
"""

from __future__ import annotations

from console.actions.accounts import (
    create_user,
    delete_user,
    record_password_change,
    record_sso_sign_in,
    remove_role,
    save_user,
    set_password,
    set_role,
)
from console.actions.alertmanager import latch_alert_faults, record_alertmanager
from console.actions.audit import SYSTEM, actor_name, audit, require
from console.actions.breaker import breaker_payload, set_breaker
from console.actions.conditions import open_condition, settle_conditions
from console.actions.diagnosis import record_diagnosis, record_ended_generation, record_located
from console.actions.errors import (
    ChangeError,
    Conflict,
    IncidentChangeError,
    NotAllowed,
    NotFound,
    ObjectivesError,
    RemediationError,
    SloError,
)
from console.actions.fleet import (
    isolate_gpu,
    latch_condition,
    latch_fault,
    mark_node,
    mark_out_of_service,
    mark_returned,
    mark_silent_together,
    node_reporting,
    record_repair_evidence,
    register_node,
    return_to_service,
    set_node_health,
    settle_fleet_silence,
)
from console.actions.groups import SLO_KEYS, set_group_objectives, set_group_slo
from console.actions.incidents import acknowledge_incident, assign_incident, comment_on_incident
from console.actions.notifications import deliver, freeze_policies, schedule_due
from console.actions.paging import (
    create_silence,
    delete_escalation_policy,
    expire_silence,
    save_channel,
    save_escalation_policy,
)
from console.actions.proposals import (
    cause_of_incident,
    remediate,
    remediate_group,
    remediate_nodes,
)
from console.actions.recovery import record_incident_costs
from console.actions.remediation import (
    Outcome,
    abandon_action,
    agent_payload,
    cancel_action,
    deadline_of,
    dispatch_action,
    dispatch_for_node,
    expire_actions,
    propose_action,
    record_action_result,
    route_waiting,
    vote_on_action,
    withdraw_action,
)
from console.actions.returns import propose_returns
from console.actions.tokens import issue_api_token, revoke_api_tokens

__all__ = [
    "SLO_KEYS",
    "SYSTEM",
    "ChangeError",
    "Conflict",
    "IncidentChangeError",
    "NotAllowed",
    "NotFound",
    "ObjectivesError",
    "Outcome",
    "RemediationError",
    "SloError",
    "abandon_action",
    "acknowledge_incident",
    "actor_name",
    "agent_payload",
    "assign_incident",
    "audit",
    "breaker_payload",
    "cancel_action",
    "cause_of_incident",
    "comment_on_incident",
    "create_silence",
    "create_user",
    "deadline_of",
    "delete_escalation_policy",
    "delete_user",
    "deliver",
    "dispatch_action",
    "dispatch_for_node",
    "expire_actions",
    "expire_silence",
    "freeze_policies",
    "isolate_gpu",
    "issue_api_token",
    "latch_alert_faults",
    "latch_condition",
    "latch_fault",
    "mark_node",
    "mark_out_of_service",
    "mark_returned",
    "mark_silent_together",
    "node_reporting",
    "open_condition",
    "propose_action",
    "propose_returns",
    "record_action_result",
    "record_alertmanager",
    "record_diagnosis",
    "record_ended_generation",
    "record_incident_costs",
    "record_located",
    "record_password_change",
    "record_repair_evidence",
    "record_sso_sign_in",
    "register_node",
    "remediate",
    "remediate_group",
    "remediate_nodes",
    "remove_role",
    "require",
    "return_to_service",
    "revoke_api_tokens",
    "route_waiting",
    "save_channel",
    "save_escalation_policy",
    "save_user",
    "schedule_due",
    "set_breaker",
    "set_group_objectives",
    "set_group_slo",
    "set_node_health",
    "set_password",
    "set_role",
    "settle_conditions",
    "settle_fleet_silence",
    "vote_on_action",
    "withdraw_action",
]
