from django.apps import AppConfig


class OperatorsConfig(AppConfig):
    """Operator routes under /admin/..., the registry's database store and the Django
    admin console (/console/). Loads nothing at import or in ready(): pantheon_site.asgi
    starts the loader, so `migrate` and other commands never load a model."""

    name = "operators"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Runtime config overrides live in this app's table (no database access here:
        # pantheon_site.asgi reads them at start-up, live_settings.refresh()).
        from operators.config import DatabaseOverrides
        from pantheon_platform import live_settings

        live_settings.use_store(DatabaseOverrides())
