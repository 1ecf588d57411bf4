from django.apps import AppConfig


class SessionsConfig(AppConfig):
    """Session routes (/session/...), not yet written. The label keeps clear of
    django.contrib.sessions, which the admin console needs and which owns "sessions"."""

    name = "sessions"
    label = "pantheon_sessions"
    default_auto_field = "django.db.models.BigAutoField"
