"""WSGI entry point: gunicorn serves HTTP (pages, API, ingest) through it."""

from __future__ import annotations

import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
_django = get_wsgi_application()

# Load every view now and move the ~100k objects of a loaded Django out of the cyclic GC's
# reach: they live as long as the worker, and scanning them on each full collection
# doubled the cost of decoding a 1,000-record batch (docs/performance.md).
from django.urls import get_resolver  # noqa: E402 - after the app is set up

from faultline.lean import IngestHandler, dispatch  # noqa: E402 - after the app is set up

get_resolver().url_patterns  # noqa: B018 - imports every view module
# Agent batches skip the middleware they never use (faultline.lean); the rest as before.
application = dispatch(_django, IngestHandler())
gc.freeze()
