"""Top-level routes: health, ingest and the agent endpoints, REST, schema, admin, pages."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from faultline import alertmanager, health, metrics, scrape
from faultline.login import ThrottledLoginView
from ingest.views import ingest

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", scrape.metrics, name="metrics"),
    path("api/v1/ingest", metrics.count_ingest(ingest), name="ingest"),
    path("api/v1/alertmanager", alertmanager.receiver, name="alertmanager"),
    path("api/v1/", include("ingest.urls")),  # the agent-facing action poll and result
    path("api/v1/", include("console.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger"),
    # The admin's own login form would bypass the throttle: route it through ours.
    path("admin/login/", ThrottledLoginView.as_view(), name="admin-login"),
    path("admin/", admin.site.urls),
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("console.urls")),
]

if settings.OIDC_ENABLED:  # /oidc/authenticate/ and /oidc/callback/ (faultline.sso)
    urlpatterns.insert(0, path("oidc/", include("mozilla_django_oidc.urls")))
