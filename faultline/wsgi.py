"""WSGI entry point: gunicorn serves HTTP (pages, API, ingest) through it."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "faultline.settings")
application = get_wsgi_application()
