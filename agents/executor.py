"""Runs approved actions on this node through configured hooks, exactly once per action id.

Owns action execution: it receives approved actions (riding back on ingest responses, or
polled from `GET <server>/api/v1/agents/actions`), runs the hook configured for the action
kind with a timeout (or, with `scheduler = "slurm"|"kubernetes"` configured and no hook for
the kind, the built-in backend in agents/schedulers/), and reports the result to
`POST <server>/api/v1/actions/<id>/result`. It must never decide *whether* an action is
wise — the service's gates and human approvers do — but it does refuse what is provably
stale: an action for an older generation than the newest it has seen for that group
(fencing, DESIGN.md §1 contract 1). Hooks run as argument lists, never through a shell.

It does not trust the server for what reaches a hook or a backend: an action
must carry a valid signature made with this agent's key (agents/signing.py) unless
`allow_unsigned` is configured for a migration; its kind must be one this node accepts
(`allowed_kinds`, default: the kinds with a hook, plus every contract kind when a
scheduler backend is configured); its target (and
`params.node`/`params.gpu`) must be this node, one of this node's GPUs, or a group this
node has reported records for — or, on an agent configured as the scheduler's controller
(`controller_nodes`), another node a glob allows, for the node kinds a controller runs
(their spec's `controller`); every value substituted into a hook is checked by the
contract's rules (agents/actions_contract.py: safe characters, never a leading `-`, no
control characters, typed params) and a group action without an integer generation is
refused, so fencing is never skipped. An action past the deadline it carries (signed
with it) is refused and reported: the service has already failed it.
"""

from __future__ import annotations

import fnmatch
import http.client
import json
import logging
import queue
import re
import shlex
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agents import actions_contract as contract
from agents import schedulers, signing, vocab
from agents.sender import opener_for
from agents.spool import read_json, write_atomic

log = logging.getLogger("faultline.agent.executor")

# The one limit both sides keep (agents/vocab.py); the clipped text fits within it.
OUTPUT_LIMIT = vocab.ACTION_OUTPUT_LIMIT
_CUT = "\n...[truncated]...\n"

# Examples documented in docs/agent.md; nothing runs unless configured.
EXAMPLE_HOOKS = {
    "cordon_node": "kubectl cordon {node}",
    "drain_node": 'scontrol update nodename={node} state=drain reason="{reason}"',
}


# The wire contract's Name charset (agents/protocol.py), minus a leading "-": a value that
# starts with "-" becomes an option of the hook's program (`kubectl cordon --all`).
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.:@/][A-Za-z0-9_.:@/\-]{0,127}$")


class _SafeDict(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class Refused(ValueError):
    """An action this node will not run; the message says which value and why."""


class Executor:
    def __init__(
        self,
        state_dir: Path,
        *,
        node: str,
        hooks: dict[str, str],
        server: str = "",
        token: str = "",
        dry_run: bool = False,
        timeout_s: float = 60.0,
        scheduler: str | None = None,
        allowed_kinds: Iterable[str] | None = None,
        gpus: Iterable[str] | Callable[[], Iterable[str]] = (),
        allow_unsigned: bool = False,
        controller_nodes: Iterable[str] = (),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.node = node
        self._clock = clock
        # Empty: not a controller; the target is always this node, its GPUs or its groups.
        self.controller_nodes = tuple(controller_nodes)
        self.hooks = contract.normalize_hooks(hooks)
        self.scheduler = schedulers.backend_named(scheduler)
        self.server = server.rstrip("/")
        self.token = token
        self.dry_run = dry_run
        self.timeout_s = timeout_s
        if allowed_kinds is None:
            # With a backend, every contract kind: one it cannot do answers "unsupported"
            # (running nothing) and names the hook to add.
            backend = frozenset(contract.KINDS) if self.scheduler is not None else frozenset()
            self.allowed_kinds = frozenset(self.hooks) | backend
        else:
            self.allowed_kinds = frozenset(contract.canonical(k) for k in allowed_kinds)
        self._gpus = gpus if callable(gpus) else (lambda fixed=frozenset(gpus): fixed)
        self.allow_unsigned = allow_unsigned
        self._key = signing.key_from_token(token) if token else None
        self._path = Path(state_dir) / "executor.json"
        state = read_json(self._path, {})
        self.done: dict[str, dict[str, Any]] = state.get("done", {})
        self.generations: dict[str, int] = state.get("generations", {})
        for result in self.done.values():
            if result.get("status") == "running":
                # The agent died while the hook ran: never rerun it blind, say so instead.
                result.update(
                    status="failed",
                    exit_code=None,
                    reported=False,
                    output="agent restarted while the hook ran; outcome unknown",
                )
        self._lock = threading.Lock()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._opener = opener_for(server) if server else None

    # -- state -----------------------------------------------------------------------
    def _save(self) -> None:
        body = {"done": self.done, "generations": self.generations}
        write_atomic(self._path, json.dumps(body).encode())

    def observe(self, group: str | None, generation: Any) -> None:
        """Learn a group's generation from any record or action naming it."""
        if not group or not isinstance(generation, int):
            return
        with self._lock:
            if generation > self.generations.get(group, -1):
                self.generations[group] = generation
                self._save()

    # -- checks ----------------------------------------------------------------------
    def authentic(self, action: dict[str, Any]) -> str | None:
        """None when the action may be considered at all; else why it is dropped unseen.

        A dropped action is neither recorded nor reported: its id may be forged, and a
        report would mark the real action of that id failed.
        """
        if signing.SIGNATURE_FIELD not in action:
            return None if self.allow_unsigned else "unsigned action (allow_unsigned is off)"
        if self._key is None:
            return "signed action but this agent has no token to verify it with"
        if not signing.verify(action, self._key):
            return "bad signature"
        return None

    def check(self, action: dict[str, Any]) -> None:
        """Raise Refused unless this node's own limits allow the action as given."""
        kind = action.get("kind")
        if not isinstance(kind, str) or contract.canonical(kind) not in self.allowed_kinds:
            allowed = ", ".join(sorted(self.allowed_kinds)) or "none"
            raise Refused(f"action kind {kind!r} is not accepted on this node (allowed: {allowed})")
        if action.get("node") not in (None, self.node):
            raise Refused(f"action is for node {action.get('node')!r}, this is {self.node!r}")
        group = action.get("group")
        if group is not None and not (isinstance(group, str) and SAFE_NAME.match(group)):
            raise Refused(
                f"group {group!r} is not a safe name (letters, digits, _.:@/-; no leading -)"
            )
        generation = action.get("generation")
        generation_ok = (
            isinstance(generation, int) and not isinstance(generation, bool) and generation >= 0
        )
        if (group is not None or generation is not None) and not generation_ok:
            raise Refused(f"generation {generation!r} must be a non-negative integer (fencing)")
        self._check_target(action.get("target"), group, kind)
        raw = action.get("params")
        if raw is not None and not isinstance(raw, dict):
            raise Refused("params must be an object")
        params: dict[str, Any] = raw or {}
        found = contract.param_problems(params)
        if found:
            raise Refused("; ".join(found))
        # The backends act on params.node / params.gpu before the target: the same limits.
        if params.get("node") not in (None, "", self.node):
            self._check_other_node(kind, str(params["node"]), f"params.node {params['node']!r}")
            target = str(action.get("target") or "")
            if target.startswith("node:") and target != f"node:{params['node']}":
                raise Refused(f"params.node {params['node']!r} is not the target {target!r}")
        if params.get("gpu") not in (None, "") and params["gpu"] not in set(self._gpus()):
            raise Refused(f"params.gpu {params['gpu']!r} is not a GPU of this node")

    def _check_other_node(self, kind: Any, name: str, what: str) -> None:
        """Another node's name: only a controller agent acts on it, only for the node kinds
        a controller runs, only for a name its globs allow, and only through a backend or
        a hook (both act on the named node: `params.node`, the `{node}` placeholder)."""
        if not self.controller_nodes:
            raise Refused(f"{what} is not this node ({self.node}); this agent is no controller")
        if not SAFE_NAME.match(name):  # one node: no Slurm hostlist ("gpu-[01-99]", "a,b")
            raise Refused(f"{what} is not one safe node name")
        controller_kinds = contract.controller_kinds()
        if contract.canonical(str(kind)) not in controller_kinds:
            allowed = ", ".join(sorted(controller_kinds))
            raise Refused(f"{what}: a controller runs only {allowed} for another node")
        if not any(fnmatch.fnmatchcase(name, glob) for glob in self.controller_nodes):
            globs = ", ".join(self.controller_nodes)
            raise Refused(f"{what} is not a node this controller acts on ({globs})")

    def _check_target(self, target: Any, group: Any, kind: Any = None) -> None:
        if not isinstance(target, str) or ":" not in target:
            raise Refused(f"target {target!r} must be node:, gpu:, rank: or group:")
        prefix, _, name = target.partition(":")
        if prefix not in contract.TARGETS or not SAFE_NAME.match(name):
            raise Refused(f"target {target!r} must be node:, gpu:, rank: or group: a safe name")
        if prefix == "node" and name != self.node:
            self._check_other_node(kind, name, f"target {target!r}")
        if prefix == "gpu" and name not in set(self._gpus()):
            raise Refused(f"target {target!r} is not a GPU of this node")
        if prefix in ("rank", "group"):
            target_group = name.rsplit("/", 1)[0] if prefix == "rank" else name
            if target_group != group or target_group not in self.generations:
                raise Refused(
                    f"target {target!r}: this node hosts no ranks of group {target_group!r}"
                )

    # -- execution -------------------------------------------------------------------
    def handle(self, action: dict[str, Any]) -> dict[str, Any] | None:
        """Run one action; None when this action id was already handled (idempotent)."""
        action_id = str(action.get("id", ""))
        if not action_id:
            log.warning("action without id ignored: %s", action)
            return None
        why = self.authentic(action)
        if why is not None:
            log.warning("action %s dropped: %s", action_id, why)
            return {"status": "failed", "exit_code": None, "output": f"dropped: {why}"}
        with self._lock:
            if action_id in self.done:
                return None
            group = action.get("group")
            generation = action.get("generation")
            refusal = contract.past_deadline(action, self._clock())
            try:
                self.check(action)
            except Refused as exc:
                refusal = refusal or str(exc)
            newest = self.generations.get(group, -1) if isinstance(group, str) else -1
            stale = refusal is None and isinstance(generation, int) and generation < newest
            # Reserve the id before running so a duplicate delivery cannot run it twice.
            self.done[action_id] = {"status": "running", "reported": False}
            self._save()
        if refusal is not None:
            result = {"status": "failed", "exit_code": None, "output": f"refused: {refusal}"}
        elif stale:
            result = {
                "status": "failed",
                "exit_code": None,
                "output": f"refused: generation {generation} of group {group} is older than "
                f"generation {newest} already seen on this node",
            }
        else:
            self.observe(group, generation)
            try:
                result = self._run(action)
            except Exception as exc:
                # Left as "running", the action was never reported and stayed dispatched
                # until the agent restarted; whatever went wrong, the service hears of it.
                log.exception("action %s: the hook or backend raised", action_id)
                result = {
                    "status": "failed",
                    "exit_code": None,
                    "output": _bound(f"error: {type(exc).__name__}: {exc}"),
                }
        with self._lock:
            self.done[action_id] = {**result, "reported": False}
            self._save()
        self._report(action_id)
        return result

    def _argv(self, action: dict[str, Any]) -> list[str] | None:
        template = self.hooks.get(contract.canonical(str(action.get("kind"))))
        if not template:
            return None
        params = action.get("params") or {}
        values = _SafeDict(
            {k: str(v) for k, v in params.items()} if isinstance(params, dict) else {}
        )
        values.update(
            # The node acted on: this one, or (a controller) the node the action names.
            node=contract.node_name(action, self.node),
            target=str(action.get("target") or self.node),
            group=str(action.get("group") or ""),
            generation="" if action.get("generation") is None else str(action["generation"]),
            kind=str(action.get("kind")),
            action_id=str(action.get("id")),
            reason=str(
                params.get("reason")
                if isinstance(params, dict) and params.get("reason")
                else f"faultline action {action.get('id')}"
            ),
        )
        return [part.format_map(values) for part in shlex.split(template)]

    def _run(self, action: dict[str, Any]) -> dict[str, Any]:
        kind = contract.canonical(str(action.get("kind")))
        if kind not in self.hooks and self.scheduler is not None and kind in contract.KINDS:
            # The built-in backend answers every contract kind ("unsupported" included).
            params = contract.params_of(action)
            dry_run = self.dry_run or params.get("dry_run") is True
            return dict(
                schedulers.execute(
                    self.scheduler,
                    action,
                    node=self.node,
                    timeout_s=self.timeout_s,
                    dry_run=dry_run,
                )
            )
        argv = self._argv(action)
        if argv is None:
            return {
                "status": "failed",
                "exit_code": None,
                "output": f"no hook configured for action kind {action.get('kind')!r}",
            }
        if self.dry_run or contract.params_of(action).get("dry_run") is True:
            # A dry run never runs its hook, whoever asked for it.
            return {
                "status": "succeeded",
                "exit_code": 0,
                "output": f"dry-run: would run {shlex.join(argv)}",
            }
        try:
            done = subprocess.run(argv, capture_output=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            partial = (exc.stdout or b"") + (exc.stderr or b"")
            return {
                "status": "failed",
                "exit_code": None,
                "output": _bound(
                    f"timed out after {self.timeout_s:g}s\n" + partial.decode(errors="replace")
                ),
            }
        except OSError as exc:
            return {"status": "failed", "exit_code": None, "output": f"cannot run hook: {exc}"}
        output = (done.stdout + done.stderr).decode(errors="replace")
        return {
            "status": "succeeded" if done.returncode == 0 else "failed",
            "exit_code": done.returncode,
            "output": _bound(output),
        }

    # -- reporting -------------------------------------------------------------------
    def _report(self, action_id: str) -> bool:
        if self._opener is None:
            return False
        result = self.done.get(action_id, {})
        body = {k: result.get(k) for k in ("status", "exit_code", "output")}
        if result.get("outcome"):
            body["outcome"] = result["outcome"]  # agents/actions_contract.py Outcome
        url = f"{self.server}/api/v1/actions/{urllib.parse.quote(action_id)}/result"
        request = urllib.request.Request(  # noqa: S310 -- server URL comes from config
            url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        try:
            with self._opener.open(request, timeout=10) as response:
                ok = 200 <= int(response.status) < 300
        except urllib.error.HTTPError as exc:
            # 409/404: the service already has a result or forgot the action; stop trying.
            ok = exc.code in (404, 409)
            log.warning("action %s result: HTTP %s", action_id, exc.code)
        except (OSError, http.client.HTTPException) as exc:
            # HTTPException: a reply cut short (IncompleteRead) is not an OSError.
            log.warning("action %s result not delivered yet: %s", action_id, exc)
            ok = False
        if ok:
            with self._lock:
                self.done[action_id]["reported"] = True
                self._save()
        return ok

    def poll_once(self) -> int:
        """Fetch approved actions for this node and queue them; returns how many arrived."""
        for action_id, result in list(self.done.items()):
            if not result.get("reported") and result.get("status") != "running":
                self._report(action_id)
        if self._opener is None:
            return 0
        url = f"{self.server}/api/v1/agents/actions?node={urllib.parse.quote(self.node)}"
        request = urllib.request.Request(  # noqa: S310 -- server URL comes from config
            url, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with self._opener.open(request, timeout=10) as response:
                payload = json.loads(response.read() or b"[]")
        except (OSError, ValueError, http.client.HTTPException) as exc:
            log.debug("action poll failed: %s", exc)
            return 0
        actions = payload.get("actions", []) if isinstance(payload, dict) else payload
        if isinstance(actions, list):
            self.submit(actions)
            return len(actions)
        return 0

    # -- threads ---------------------------------------------------------------------
    def submit(self, actions: list[dict[str, Any]]) -> None:
        for action in actions:
            if isinstance(action, dict):
                self._queue.put(action)

    def _work(self) -> None:
        while True:
            action = self._queue.get()
            if action is None:
                return
            try:
                self.handle(action)
            except Exception:
                log.exception("action %s failed to run", action.get("id"))

    def _poll(self, every: float) -> None:
        """Poll until stopped, whatever one poll raised: a poller that died on one odd reply
        left every later action dispatched and unrun until its deadline (900 s), with
        nothing in the service's log."""
        while not self._stop.wait(every):
            try:
                self.poll_once()
            except Exception:
                log.exception("action poll failed; polling on")

    def start(self, *, poll_s: float = 15.0) -> None:
        worker = threading.Thread(target=self._work, name="executor", daemon=True)
        worker.start()
        self._threads.append(worker)
        if poll_s > 0:
            poller = threading.Thread(
                target=self._poll, args=(poll_s,), daemon=True, name="action-poll"
            )
            poller.start()
            self._threads.append(poller)

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=2)


def _bound(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    keep = (OUTPUT_LIMIT - len(_CUT)) // 2
    return text[:keep] + _CUT + text[-keep:]
