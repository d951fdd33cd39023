from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = [
    "console.policy.roles",
    "console.policy.lifecycle",
    "console.policy.gates",
    "console.policy.dryrun",
    "console.policy.remediation",
    "console.policy.escalation",
    "console.notify.webhook",
    "console.notify.slack",
    "console.notify.pagerduty",
    "console.notify.transport",
]
CODE = (
    "import importlib, json, sys\n"
    f"for m in {MODULES!r}: importlib.import_module(m)\n"
    "print(json.dumps(sorted(n for n in sys.modules "
    "if n.split('.')[0] in {'django', 'celery', 'channels', 'rest_framework', 'requests'})))\n"
)


def test_it_loads_no_framework_when_importing_policy_and_notify() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
