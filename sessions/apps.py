from django.apps import AppConfig


class SessionsConfig(AppConfig):
    """Session routes (/session/...), not yet written. The label keeps clear of
    django.contrib.sessions, which the admin console needs and which owns "sessions"."""

    name = "sessions"
    label = "pantheon_sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from access.models import ApiKey
        from sessions import tenancy

        # Per-key session caps depend on how many keys could hold sessions: a console
        # key saved or deleted in this process is counted at once.
        post_save.connect(tenancy.refresh, sender=ApiKey, dispatch_uid="sessions-keys-save")
        post_delete.connect(tenancy.refresh, sender=ApiKey, dispatch_uid="sessions-keys-del")
