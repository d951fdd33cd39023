"""Login throttle: a few wrong passwords per (username, client IP), then 429 for a while.

Owns counting failed password checks in the cache and refusing further tries until the
window passes, for the login form and for HTTP Basic on the API (the same password, the
same guesser). It must not lock anyone out when the cache is down: a console that nobody
can open during an incident is worse than a slower brute force, so it fails open and logs.
The client IP is faultline.client's: REMOTE_ADDR, never a client's X-Forwarded-For (a
guesser would set it per request), unless FAULTLINE_TRUSTED_PROXIES names the proxy.
"""

from __future__ import annotations

import hashlib
import logging
import unicodedata
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from drf_spectacular.authentication import BasicScheme
from rest_framework import authentication, exceptions

from faultline.client import client_address

log = logging.getLogger(__name__)


def normalise(username: str) -> str:
    """The name as Django authenticates it (the login form applies NFKC), folded for case.

    Counting the raw string let a locked-out user log in as the fullwidth look-alike of
    their own name: a different counter, the same account.
    """
    return unicodedata.normalize("NFKC", username).strip().casefold()


def _key(username: str, request: HttpRequest) -> str:
    who = f"{normalise(username)}|{client_address(request)}"
    return "login-fail:" + hashlib.sha256(who.encode()).hexdigest()[:32]


def is_locked(username: str, request: HttpRequest) -> bool:
    try:
        return int(cache.get(_key(username, request)) or 0) >= settings.LOGIN_FAILURE_LIMIT
    except Exception:
        log.warning("login throttle: cache unavailable, not throttling", exc_info=True)
        return False


def record_failure(username: str, request: HttpRequest) -> None:
    key = _key(username, request)
    try:
        # add() starts the window on the first failure; incr() never extends it.
        if not cache.add(key, 1, timeout=settings.LOGIN_LOCKOUT_S):
            cache.incr(key)
    except Exception:
        log.warning("login throttle: could not count a failure", exc_info=True)


def clear(username: str, request: HttpRequest) -> None:
    try:
        cache.delete(_key(username, request))
    except Exception:
        log.warning("login throttle: could not clear", exc_info=True)


def _too_many() -> HttpResponse:
    seconds = settings.LOGIN_LOCKOUT_S
    response = HttpResponse(
        f"Too many failed logins for this user from your address: try again in {seconds} s "
        "or ask an admin.",
        status=429,
        content_type="text/plain",
    )
    response["Retry-After"] = str(seconds)
    return response


class ThrottledLoginView(auth_views.LoginView):
    """Django's login view that answers 429 once the failure limit is reached."""

    template_name = "login.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["sso_name"] = settings.OIDC_PROVIDER_NAME if settings.OIDC_ENABLED else ""
        context["sso_refused"] = self.request.GET.get("sso") == "refused"
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        username = str(request.POST.get("username", ""))
        # Checked before the password: a guesser learns nothing, even from a right guess.
        if is_locked(username, request):
            log.warning("login throttled for %r from %s", username, client_address(request))
            return _too_many()
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        record_failure(str(self.request.POST.get("username", "")), self.request)
        return super().form_invalid(form)

    def form_valid(self, form: Any) -> HttpResponse:
        clear(str(self.request.POST.get("username", "")), self.request)
        return super().form_valid(form)


class ThrottledBasicAuthentication(authentication.BasicAuthentication):
    """HTTP Basic for the API, sharing the login form's failure counter."""

    def authenticate_credentials(
        self, userid: str, password: str, request: Any = None
    ) -> tuple[Any, None]:
        raw = getattr(request, "_request", request)
        if raw is not None and is_locked(userid, raw):
            raise exceptions.Throttled(wait=settings.LOGIN_LOCKOUT_S)
        try:
            result = super().authenticate_credentials(userid, password, request)
        except exceptions.AuthenticationFailed:
            if raw is not None:
                record_failure(userid, raw)
            raise
        return result


class ThrottledBasicScheme(BasicScheme):
    """Documents the throttled Basic auth as `basicAuth` in the OpenAPI schema.

    drf-spectacular matches authenticators by exact class, so without this the schema
    silently omitted Basic from every operation's security.
    """

    target_class = "faultline.login.ThrottledBasicAuthentication"
