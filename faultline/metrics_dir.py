"""Where the processes of one `faultline up` keep their Prometheus samples (multiprocess mode).

Owns choosing, emptying and exporting PROMETHEUS_MULTIPROC_DIR before the supervisor starts
its children: gunicorn's workers, uvicorn and the Celery worker each write their samples to
memory-mapped files there, and whichever web worker answers /metrics sums them. It must not
import prometheus_client (the client picks its storage from this variable at import time).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare(data_dir: Path) -> Path:
    """Empty (or create) the samples folder and export it to the children.

    A folder the operator exported is honoured; otherwise it is `<data dir>/metrics`. Only
    the client's own `*.db` files are removed: samples of a previous run would otherwise be
    summed into this one's counters, and dead processes' gauges would never go away.
    """
    folder = Path(os.environ.get(ENV) or data_dir / "metrics").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink(missing_ok=True)
    os.environ[ENV] = str(folder)
    return folder
