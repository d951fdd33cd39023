"""The action contract, version 1: the kinds an agent executes, their params and results.

The one definition of what the service may dispatch to an agent and what comes back, and
of every action kind (`SPECS`: what it targets, what it does to capacity, its inverse, its
params, preview, backends, whether a controller agent may run it): the service validates
proposals, resolves targets, gates, previews and builds dispatch payloads from these
specs; the agent's executor looks hooks up by these names and its scheduler backends
(agents/schedulers/) implement them. Standard library only (the node agent imports it).
It must not run anything: executing is agents/executor.py's job, scheduling
agents/schedulers/'s.

Adding a kind or an optional param is not a version change; renaming or removing one is
(ACTIONS_VERSION += 1, the old names stay accepted as aliases).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, NotRequired, TypedDict

log = logging.getLogger("faultline.agent.actions")

ACTIONS_VERSION = 1

# What an action's target string names (`<target>:<name>`): the target grammar the service
# resolves (console.actions.targets) and the executor checks. `rank` is `<group>/<rank>`.
TARGETS = ("node", "gpu", "rank", "group")
Target = Literal["node", "gpu", "rank", "group", "any"]  # any: whichever of TARGETS
# What a kind does to capacity; the gates read it (console.policy.gates): a take-out counts
# against the node or GPU blast radius, a put-back meets the ownership and repeat rules
# instead, a restart needs diagnosis' auto_restart_safe.
Effect = Literal["take_out", "put_back", "restart", "none"]
# What a succeeded take-out marks on the node (console.actions.fleet.mark_node).
Mark = Literal["quarantined", "cordoned", ""]
# The built-in scheduler backends (agents/schedulers/), by their `scheduler = "..."` name.
BACKENDS = ("slurm", "kubernetes")


@dataclass(frozen=True)
class Param:
    name: str
    required: bool
    help: str


@dataclass(frozen=True)
class KindSpec:
    """One action kind, the only description of it: the service's lifecycle, target
    resolution, gates, dry-run preview and remediation policy, and the agent's executor and
    backends, read these fields instead of lists of their own."""

    name: str
    label: str  # what the admin and the pages call it
    target: Target  # what its target string names
    effect: Effect
    params: tuple[Param, ...]
    help: str  # what it does, for people configuring hooks
    # The dry run's sentence for it (console.policy.dryrun); {target}, {node}, {gpu} and
    # {group} are the proposal's.
    preview: str
    # An agent runs it (through a hook or a backend): it is part of this contract. False:
    # the service's own until the contract carries it (a site may still hook the name).
    agent: bool = True
    inverse: str = ""  # the kind that puts back what this one takes out
    marks: Mark = ""  # what a succeeded node take-out marks on the node
    # A scheduler takes a node out or puts it back by its name from any host with the
    # rights (`scontrol` on the Slurm controller or a login host, a kubeconfig that may patch
    # nodes), so an agent configured as the scheduler's controller (`controller = true`)
    # runs these for a node whose own agent is silent. A GPU's isolation names a GPU only
    # its own node's agent knows; a restart is the group's.
    controller: bool = False
    # The built-in backends that run it; any other answers "unsupported" unless a hook
    # names it. The policy reads this to choose, e.g., drain_node over isolate_gpu on Slurm,
    # which cannot take one GPU out without a reconfiguration.
    backends: frozenset[str] = frozenset()

    @property
    def takes_out(self) -> bool:
        return self.effect == "take_out"

    @property
    def node_out(self) -> bool:
        """Takes a whole node out of service: counts against the node blast radius."""
        return self.effect == "take_out" and self.target == "node"

    @property
    def gpu_out(self) -> bool:
        """Takes one GPU out of service: counts against the GPU blast radius."""
        return self.effect == "take_out" and self.target == "gpu"

    @property
    def on_generation(self) -> bool:
        """Acts on one generation of a group: dispatching it on a newer generation would act
        on work the decision never saw."""
        return self.target in ("group", "rank")

    def preview_text(self, target: str) -> str:
        """The dry run's sentence for this kind on `target` (`node:n-1`, `gpu:GPU-...`)."""
        prefix, _, name = target.partition(":")
        values = {t: "" for t in TARGETS} | {prefix: name, "target": target}
        values["group"] = values["group"] or values["rank"].rpartition("/")[0]
        return self.preview.format_map(values)


_NODE = Param(
    "node", False, "scheduler node name; default: the node named by target, else the agent's"
)
_REASON = Param("reason", False, "why, written into the scheduler's reason (Slurm) / event")
_GPU = Param(
    "gpu", True, "GPU UUID (GPU-...) as the agent reports it; default: from target gpu:<uuid>"
)
_JOB = Param("job", True, "scheduler job id: Slurm job id, or the workload name the hook knows")
_DRAIN_TIMEOUT = Param(
    "drain_timeout_s", False, "Kubernetes: kubectl drain --timeout, whole seconds 1-86400 (300)"
)
_FORCE = Param("force", False, "true: put back a node another party took out (default false)")

CORDON_NODE = "cordon_node"
DRAIN_NODE = "drain_node"
QUARANTINE_NODE = "quarantine_node"
ISOLATE_GPU = "isolate_gpu"
ISOLATE_RANK = "isolate_rank"
RESTART_GROUP = "restart_group"
UNCORDON_NODE = "uncordon_node"
RELEASE_GPU = "release_gpu"
ROLLBACK_MODEL = "rollback_model"
PAGE_HUMAN = "page_human"

_ALL = frozenset(BACKENDS)
_SLURM = frozenset({"slurm"})
_KUBERNETES = frozenset({"kubernetes"})

# Every action kind, in the order the console lists them (its model choices, in its
# migrations). Adding a kind is adding its spec here: the service and the agent follow
# (tests/agents/test_kind_registry.py); the console's model choices need `makemigrations`.
SPECS: dict[str, KindSpec] = {
    spec.name: spec
    for spec in (
        KindSpec(
            QUARANTINE_NODE,
            "quarantine node",
            "node",
            "take_out",
            (_NODE, _REASON, _DRAIN_TIMEOUT),
            "drain and mark it Faultline's until a validated repair returns it",
            "node {node} is drained and quarantined until a validated repair returns it",
            inverse=UNCORDON_NODE,
            marks="quarantined",
            controller=True,
            backends=_ALL,
        ),
        KindSpec(
            CORDON_NODE,
            "cordon node",
            "node",
            "take_out",
            (_NODE, _REASON),
            "no new work lands on the node",
            "node {node} takes no new work; what runs there goes on",
            inverse=UNCORDON_NODE,
            marks="cordoned",
            controller=True,
            backends=_ALL,
        ),
        KindSpec(
            DRAIN_NODE,
            "drain node",
            "node",
            "take_out",
            (_NODE, _REASON, _DRAIN_TIMEOUT),
            "cordon, then move work off it",
            "node {node} takes no new work and its work moves off",
            inverse=UNCORDON_NODE,
            marks="cordoned",
            controller=True,
            backends=_ALL,
        ),
        KindSpec(
            ISOLATE_GPU,
            "isolate GPU",
            "gpu",
            "take_out",
            (_NODE, _GPU, _REASON),
            "keep work off one GPU",
            "GPU {gpu} takes no new work; the rest of its node stays in service",
            inverse=RELEASE_GPU,
            backends=_KUBERNETES,
        ),
        KindSpec(
            ISOLATE_RANK,
            "isolate rank",
            "rank",
            "take_out",
            (),
            "keep one rank of a group out of its collectives",
            "rank {rank} is kept out of its group's collectives",
            agent=False,
        ),
        KindSpec(
            RESTART_GROUP,
            "restart group",
            "group",
            "restart",
            (_JOB, _REASON),
            "requeue the group's job so it restarts (from its checkpoint) without the node",
            "the job of {group} is requeued and restarts from its checkpoint",
            backends=_SLURM,
        ),
        KindSpec(
            UNCORDON_NODE,
            "return node to service",
            "node",
            "put_back",
            (_NODE, _REASON, _FORCE),
            "return the node to service",
            "node {node} returns to service",
            controller=True,
            backends=_ALL,
        ),
        KindSpec(
            RELEASE_GPU,
            "return GPU to service",
            "gpu",
            "put_back",
            (_NODE, _GPU, _REASON),
            "return the GPU to service",
            "GPU {gpu} returns to service",
            backends=_KUBERNETES,
        ),
        KindSpec(
            ROLLBACK_MODEL,
            "roll back model",
            "group",
            "none",
            (),
            "serve the model version before this one",
            "{group} serves its previous model version",
            agent=False,
        ),
        KindSpec(
            PAGE_HUMAN,
            "page a human",
            "any",
            "none",
            (),
            "ask a person to look",
            "a person is paged about {target}",
            agent=False,
        ),
    )
}


def spec_of(kind: str) -> KindSpec | None:
    """The spec of an action kind (the contract's or the service's own); None for others.
    Read at call time, so every reader sees a kind added to SPECS."""
    return SPECS.get(kind)


class _AgentKinds(Mapping[str, KindSpec]):
    """The kinds an agent runs (`agent=True`), read from SPECS on every use."""

    def __getitem__(self, name: str) -> KindSpec:
        spec = SPECS.get(name)
        if spec is None or not spec.agent:
            raise KeyError(name)
        return spec

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, spec in SPECS.items() if spec.agent])

    def __len__(self) -> int:
        return sum(1 for spec in SPECS.values() if spec.agent)


# The contract proper: what the service may dispatch to an agent, the names the agent's
# hook table is keyed by.
KINDS: Mapping[str, KindSpec] = _AgentKinds()


def controller_kinds() -> frozenset[str]:
    """Kinds an agent may run for another node, as the scheduler's controller."""
    return frozenset(name for name, spec in KINDS.items() if spec.controller)


def backend_kinds(scheduler: str) -> frozenset[str]:
    """What the built-in backend `scheduler` runs."""
    return frozenset(name for name, spec in KINDS.items() if scheduler in spec.backends)


# Both as the contract stood at import; the readers that must follow SPECS call the above.
CONTROLLER_KINDS = controller_kinds()
BACKEND_KINDS: dict[str, frozenset[str]] = {b: backend_kinds(b) for b in BACKENDS}

# Every kind also takes `dry_run` (true: run nothing, report the commands), which the
# service adds to every dispatched action (console.actions.remediation.agent_payload).
COMMON_PARAMS = ("reason", "dry_run")

# What a value in an action may hold. The node's executor refuses anything else, and the
# service refuses it at proposal by the same rules, so an approved action never fails on
# its node for its wording (a reason with a line break was approved, refused three times by
# the node, and those failures opened the circuit breaker).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # line breaks included
SAFE_PARAM_KEY = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
MAX_PARAM_CHARS = 512
REASON_CHARS = 200  # the reason as it travels (the service keeps the whole text)
DRAIN_TIMEOUT_DEFAULT_S = 300
DRAIN_TIMEOUT_MAX_S = 86_400


def value_problem(name: str, value: Any) -> str | None:
    """Why `value` may not travel as param `name`; None when it may."""
    if value is None or isinstance(value, bool | int | float):
        return None
    if not isinstance(value, str):
        return f"param {name!r} must be a string or number, got {type(value).__name__}"
    if len(value) > MAX_PARAM_CHARS:
        return f"param {name!r} is longer than {MAX_PARAM_CHARS} characters"
    if CONTROL.search(value):
        return f"param {name!r} contains control characters (a line break, say)"
    if value.startswith("-"):
        return f"param {name!r} may not begin with '-' (it would read as an option)"
    return None


def drain_timeout_s(params: dict[str, Any]) -> int:
    """params.drain_timeout_s as whole seconds (default 300); ValueError names a bad one.

    An integer, or a string of ASCII digits (what older services passed through).
    """
    raw = params.get("drain_timeout_s")
    if raw is None or raw == "":
        return DRAIN_TIMEOUT_DEFAULT_S
    if isinstance(raw, str) and raw.isascii() and raw.isdigit():
        raw = int(raw)
    if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= DRAIN_TIMEOUT_MAX_S:
        raise ValueError(
            f"params.drain_timeout_s must be whole seconds from 1 to {DRAIN_TIMEOUT_MAX_S}, "
            f"got {raw!r}"
        )
    return raw


def param_problems(params: dict[str, Any]) -> list[str]:
    """What the node would refuse in `params`: names, values, typed params."""
    found = []
    for key, value in params.items():
        if not isinstance(key, str) or not SAFE_PARAM_KEY.match(key):
            found.append(f"param name {key!r} is not a safe name")
            continue
        problem = value_problem(key, value)
        if problem is not None:
            found.append(problem)
    if "drain_timeout_s" in params:
        try:
            drain_timeout_s(params)
        except ValueError as exc:
            found.append(str(exc))
    if params.get("force") not in (None, True, False):
        found.append(f"params.force must be true or false, got {params['force']!r}")
    return found


def one_line(text: str) -> str:
    """`text` as a rule's reason may travel: control characters and line breaks become
    spaces, a leading '-' is dropped. (A person's reason is refused instead, so they see
    what will be sent.)"""
    return CONTROL.sub(" ", text).strip().lstrip("-").strip()


# The deadline a dispatched action carries (ISO 8601 UTC, inside the signed payload): the
# service fails the action then, so the node refuses it from then on, however late it
# arrives or is replayed. Actions from services that predate it carry none.
DEADLINE_FIELD = "deadline"


def deadline_text(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def past_deadline(action: dict[str, Any], now: datetime) -> str | None:
    """Why the action may no longer run at `now` (the node's clock); None while it may."""
    if DEADLINE_FIELD not in action:
        return None
    raw = action[DEADLINE_FIELD]
    try:
        deadline = datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        deadline = None
    if deadline is None or deadline.tzinfo is None:
        return f"deadline {raw!r} is not an ISO 8601 time with a zone"
    if now >= deadline:
        return (
            f"its deadline {deadline_text(deadline)} has passed (this node's clock: "
            f"{deadline_text(now)}); the service has given up on it"
        )
    return None


def problems(kind: str, params: dict[str, Any], target: str = "") -> list[str]:
    """What is wrong with an action before dispatch: unknown kinds, missing or unknown
    params, and any value the node would refuse."""
    spec = KINDS.get(canonical(kind))
    if spec is None:
        return [f'unknown action kind "{kind}"; known: {", ".join(sorted(KINDS))}']
    action = {"kind": spec.name, "params": params, "target": target}
    found = []
    known = {p.name for p in spec.params} | set(COMMON_PARAMS)
    for param in spec.params:
        have = {"gpu": gpu_id(action), "job": job_id(action)}.get(
            param.name, params.get(param.name)
        )
        if param.required and not have:
            found.append(f"{spec.name} needs params.{param.name}: {param.help}")
    found += [
        f"{spec.name} does not take params.{name}" for name in sorted(set(params) - known, key=str)
    ]
    return found + param_problems(params)


# Old hook names from before this contract (docs/agent.md ≤ 0.1) and synonyms. Accepted in
# `[hooks]` with a warning; the service only ever dispatches the canonical names.
ALIASES: dict[str, str] = {
    "cordon": CORDON_NODE,
    "drain": DRAIN_NODE,
    "quarantine": QUARANTINE_NODE,
    "reset_gpu": ISOLATE_GPU,
    "uncordon": UNCORDON_NODE,
    "resume": UNCORDON_NODE,
    "resume_node": UNCORDON_NODE,
    "release": RELEASE_GPU,
    "requeue": RESTART_GROUP,
}

# `status` is what the service's result endpoint takes; `state` says what really happened.
Status = Literal["succeeded", "failed"]
State = Literal[
    "applied",  # the command ran and the read-back shows the wanted state
    "already",  # the wanted state held before (Faultline's own earlier action): nothing run
    "held_by_other",  # taking out: someone else already took it out; left alone, reason kept
    # putting back: someone else took it out; not returned (params.force overrides); or a
    # restart of a job that does not run on this node
    "refused",
    "not_applied",  # the command ran but the read-back does not show the wanted state
    "unsupported",  # this backend cannot do this kind: configure a hook
    "error",  # the command could not run, timed out, or the target is unknown
]
SUCCEEDED_STATES = frozenset({"applied", "already", "held_by_other"})
FAULTLINE_REASON_PREFIX = "faultline:"


class Outcome(TypedDict, total=False):
    """The structured part of a result, under `result["outcome"]`."""

    contract: int  # ACTIONS_VERSION
    kind: str
    scheduler: str  # "slurm" | "kubernetes"
    target: str  # scheduler node name or job id
    state: str  # one of State
    before: dict[str, Any]  # e.g. {"state": "idle", "reason": "", "by": ""}
    after: dict[str, Any]
    taken_out_by: str  # "faultline" | "other" | "" (in service)
    commands: list[list[str]]


class Action(TypedDict):
    """One action as the service hands it to the agent (`GET /api/v1/agents/actions`, and
    the ingest response's `actions`); `params` always carries `reason` and `dry_run`;
    `deadline` (DEADLINE_FIELD) is when the service stops waiting for it."""

    id: int
    kind: str
    target: str
    group: str | None
    generation: int | None
    params: dict[str, Any]
    deadline: NotRequired[str]


class Result(TypedDict, total=False):
    status: Status
    exit_code: int | None
    output: str
    outcome: Outcome


def canonical(kind: str) -> str:
    """The contract's name for a kind or an alias; unknown names come back unchanged."""
    return ALIASES.get(kind, kind)


def normalize_hooks(hooks: dict[str, str]) -> dict[str, str]:
    """Hooks keyed by contract kind; old names are mapped with a warning, never silently."""
    out: dict[str, str] = {}
    for name, template in hooks.items():
        kind = canonical(name)
        if kind != name:
            log.warning(
                'hooks: "%s" is an old name, read as "%s"; rename it (docs/agent.md)', name, kind
            )
            if kind in hooks:
                continue  # the canonical entry wins over its alias
        elif kind not in KINDS:
            log.warning(
                'hooks: "%s" is not an action kind; known: %s', name, ", ".join(sorted(KINDS))
            )
        out[kind] = template
    return out


def params_of(action: dict[str, Any]) -> dict[str, Any]:
    params = action.get("params")
    return params if isinstance(params, dict) else {}


def reason_text(action: dict[str, Any]) -> str:
    """`faultline: <action id> <reason>` — how a scheduler records that Faultline acted."""
    params = params_of(action)
    reason = str(params.get("reason") or action.get("kind") or "").replace("\n", " ").strip()
    return f"{FAULTLINE_REASON_PREFIX} {action.get('id')} {reason}"[:250]


def is_faultline_reason(reason: str) -> bool:
    return reason.strip().lower().startswith(FAULTLINE_REASON_PREFIX)


def node_name(action: dict[str, Any], default: str) -> str:
    """The scheduler node: params.node, else a `node:<name>` target, else the agent's node."""
    params = params_of(action)
    if params.get("node"):
        return str(params["node"])
    target = str(action.get("target") or "")
    prefix, sep, name = target.partition(":")
    if sep and prefix == "node" and name:
        return name
    return default


def gpu_id(action: dict[str, Any]) -> str:
    """The GPU: params.gpu, else a `gpu:<uuid>` target; '' when neither names one."""
    params = params_of(action)
    if params.get("gpu"):
        return str(params["gpu"])
    prefix, sep, name = str(action.get("target") or "").partition(":")
    return name if sep and prefix == "gpu" else ""


def job_id(action: dict[str, Any]) -> str:
    params = params_of(action)
    return str(params.get("job") or "")


def result(
    state: str,
    output: str,
    *,
    exit_code: int | None = None,
    **outcome: Any,
) -> Result:
    """A result whose `status` follows from `state` (see SUCCEEDED_STATES)."""
    body: Outcome = {"contract": ACTIONS_VERSION, "state": state}
    body.update(outcome)  # type: ignore[typeddict-item]  # **outcome: Any keywords cannot be typed as Outcome keys
    return {
        "status": "succeeded" if state in SUCCEEDED_STATES else "failed",
        "exit_code": exit_code,
        "output": output,
        "outcome": body,
    }
