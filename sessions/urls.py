from django.urls import path

from sessions import views

# Exact paths, no trailing-slash variants: anything else is the JSON 404. GET
# /session/watch is not here: it is a Channels consumer (pantheon_site/asgi.py).
urlpatterns = [
    path("admin/session/export", views.export_session, name="session-export"),
    path("session/restore", views.restore_session, name="session-restore"),
    path("session/release", views.release_session, name="session-release"),
    path("session/estimate", views.estimate_session, name="session-estimate"),
]
