"""What `faultline demo` says on the terminal, and the demo's on-call person.

Owns the narration: one line per incident opened or resolved and per action proposed,
approved, rejected or executed, each with its console URL (read from the audit log through
console.remediation_queries.demo_feed; a thread of the demo process, reads only), and the
on-call engineer of the story: once the throttled GPU's incident opens, an operator account
proposes quarantining its node through the REST API, as a person would, and the terminal
says how to approve it. Quarantine is never auto-approved and the demo policy asks two
approvers, so the approvals page keeps it waiting until people vote.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

ONCALL = "oncall"  # the operator account the demo proposes as
ONCALL_KIND = "thermal_throttle"  # the root cause the on-call acts on (scenario.MATRIX)
POLL_S = 1.0
# Rows commit out of id order: each poll looks this far back and skips the rows it printed.
LOOK_BACK = timedelta(minutes=2)


def say(message: str) -> None:
    print(f"faultline: {message}", flush=True)


def line(item: dict[str, Any], server: str) -> str | None:
    """One terminal line for one audit row of the feed (None: not worth a line)."""
    verb, pk = item["verb"], item["object"]
    if verb.startswith("incident."):
        where = f"group {item['group']}" if item.get("group") else "fleet"
        what = "opened" if verb == "incident.opened" else "resolved"
        return f"incident #{pk} {what} ({where}): {item['summary']}  {server}/incidents/{pk}/"
    if item["actor"].startswith("rule:"):
        item = {**item, "actor": item["actor"][5:]}
    done = {
        "action.proposed": "proposed",
        "action.approved": "approved",
        "action.rejected": "rejected",
        "action.succeeded": "executed",
        "action.failed": "failed",
        "action.cancelled": "withdrawn",
    }
    if verb not in done:
        return None
    text = f"action #{pk} {done[verb]}: {item['kind']} on {item['target']} by {item['actor']}"
    if verb == "action.proposed" and item["state"] == "proposed":
        text += f"; waits for {item['approvals_required']} approver(s)  {server}/approvals/"
    return text


class Narrator(threading.Thread):
    """Prints the feed until stopped; proposes the on-call's quarantine once."""

    def __init__(
        self, server: str, oncall_password: str | None, quiet: Callable[[], bool] = bool
    ) -> None:
        super().__init__(name="demo-narrator", daemon=True)
        self.server, self.password, self.quiet = server, oncall_password, quiet
        self.stopping = threading.Event()
        self.proposed: int | None = None

    def run(self) -> None:
        from django.db import close_old_connections

        from console.remediation_queries import demo_feed

        seen: dict[str, float] = {}  # feed key -> when read; forgotten after LOOK_BACK
        since = datetime.now(UTC) - timedelta(seconds=5)
        while not self.stopping.wait(POLL_S) and not self.quiet():
            try:
                feed = demo_feed(since=since - LOOK_BACK, skip=set(seen))
            except Exception as exc:  # noqa: BLE001 - the narration must never stop the demo
                close_old_connections()
                say(f"narration paused: {exc}")
                continue
            for item in feed:
                seen[item["key"]] = time.monotonic()
                if self.quiet() or self.stopping.is_set():
                    break  # stopping: the fleet's own wind-down is not news
                text = line(item, self.server)
                if text:
                    say(text)
                if (
                    self.proposed is None
                    and item["verb"] == "incident.opened"
                    and item["kind"] == ONCALL_KIND
                ):
                    self._propose(item)
            since = datetime.now(UTC)
            old = time.monotonic() - 2 * LOOK_BACK.total_seconds()
            seen = {k: v for k, v in seen.items() if v >= old}
        close_old_connections()

    def _propose(self, incident: dict[str, Any]) -> None:
        """The on-call asks to quarantine the throttling GPU's node, through the API."""
        if self.password is None:
            return
        from console.models import Incident

        node = (
            (Incident.objects.get(pk=incident["object"]).root_cause or {}).get("evidence") or {}
        ).get("node")
        if not node:
            return
        body = {
            "kind": "quarantine_node",
            "target": f"node:{node}",
            "incident": incident["object"],
            "reason": f"{node}'s GPU keeps throttling (hardware thermal slowdown) and slows "
            f"{incident.get('group') or 'its group'}: keep it out until cooling is checked",
        }
        auth = base64.b64encode(f"{ONCALL}:{self.password}".encode()).decode()
        request = urllib.request.Request(  # noqa: S310 - http to the demo's own server
            f"{self.server}/api/v1/actions/",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as response:  # noqa: S310 - as above
                action = json.loads(response.read())["action"]
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            say(f"the on-call could not propose the quarantine: {exc}")
            self.proposed = -1
            return
        self.proposed = int(action["id"])
        need = action.get("approvals_required")
        say(
            f"action #{self.proposed} ({action['kind']} on {action['target']}, proposed by "
            f"{ONCALL}) waits for {need} approvers. Approve it on {self.server}/approvals/ "
            f"(signed in as an approver; a second one: faultline user create NAME --role "
            f"approver), or POST {self.server}/api/v1/actions/{self.proposed}/approve/ "
            f"with an approver's token or password"
        )

    def stop(self) -> None:
        self.stopping.set()
        with contextlib.suppress(RuntimeError):
            self.join(timeout=5)
