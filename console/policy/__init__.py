"""Remediation safety: roles, the action lifecycle, gates, the breaker and escalation.

Pure Python over frozen dataclasses; the caller passes `now` and stores the results.
Nothing here imports Django or does I/O (see docs/safety.md).
"""
