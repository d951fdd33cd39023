"""Faultline's wiring: settings, URLs, ASGI/WSGI, Celery and the command line."""
