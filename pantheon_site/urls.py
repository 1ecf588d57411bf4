from django.conf import settings
from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from access import console_login
from observability import dashboard
from pantheon_platform import errors
from pantheon_site import openapi

# The console's index is the live dashboard (observability/dashboard.py).
admin.site.index_template = dashboard.INDEX_TEMPLATE
# Failed console logins are throttled per address and per username (access/console_login.py).
admin.site.login_form = console_login.ThrottledLoginForm

# PANTHEON_ROLE=router: the router's own routes instead of an engine's (cluster/urls.py;
# the client routes it forwards never reach Django: cluster/asgi.py).
_ROUTES = (
    [path("", include("cluster.urls"))]
    if settings.PANTHEON_ROLE == "router"
    else [
        path("", include("wire.urls")),
        path("", include("operators.urls")),  # /admin/... operator routes (the contract)
        path("", include("sessions.urls")),  # /session/... and /admin/session/export
        path("", include("observability.urls")),  # /metrics and /admin/stats
    ]
)
urlpatterns = [
    *_ROUTES,
    # The dashboard's data, behind the console's staff session like every console page.
    path(
        "console/dashboard.json",
        admin.site.admin_view(dashboard.dashboard_data),
        name="console-dashboard",
    ),
    # The Django admin lives at /console/: /admin/... belongs to the operator routes. Its
    # login view, first: a throttled attempt is a 429 (access/console_login.py).
    path("console/login/", console_login.throttled(admin.site.login)),
    path("console/", admin.site.urls),
    path("console", RedirectView.as_view(url="/console/")),
    # The OpenAPI document of every route above (open: no key).
    path("openapi.json", openapi.openapi_view, name="openapi"),
    # Last: every other path is the contract's JSON 404 (also when DEBUG is on, where
    # Django would otherwise answer with its HTML debug page).
    re_path(r"^", errors.not_found),
]

handler400 = errors.bad_request
handler403 = errors.permission_denied
handler404 = errors.not_found
handler500 = errors.server_error_view
