"""Why a change was refused: the write path's exceptions, one family for every verb.

Owns the exception types; console/api/errors.py maps each to an HTTP status, the pages
show the message. Messages name the thing, the value and the fix. Must not import Django.
"""

from __future__ import annotations


class ChangeError(ValueError):
    """A change that cannot apply; the message names the problem and the fix (400)."""


class RemediationError(ChangeError):
    """A remediation request that cannot apply (400)."""


class IncidentChangeError(ChangeError):
    """A person's change to an incident that cannot apply (stale version, resolved...)."""


class SloError(ChangeError):
    """An SLO value we cannot use; the message names the key, the value and the range."""


class ObjectivesError(ChangeError):
    """Recovery objectives we cannot use; the message names the key and why."""


class Conflict(RemediationError):
    """The action is not in a state where this change applies (e.g. a result twice) (409)."""


class NotAllowed(PermissionError):
    """The actor's role or relation to the object does not allow this change (403)."""


class NotFound(LookupError):
    """No such object (or not one this caller may see) (404)."""
