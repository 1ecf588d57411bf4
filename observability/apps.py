from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
    verbose_name = "Usage and metrics"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Buffered usage counts are written at the end of the SIGTERM drain (the hook the
        # sessions spill uses too). The periodic flush starts with the server
        # (pantheon_site.asgi), not here: ready() runs for every management command.
        from observability import usage
        from pantheon_platform import shutdown

        shutdown.add_before_exit(usage.flush_quietly)
