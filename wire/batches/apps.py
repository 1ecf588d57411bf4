from django.apps import AppConfig


class BatchesApiConfig(AppConfig):
    """OpenAI Batches API (/v1/batches): batches and their lines in the database, run by
    the batch runner (wire/batches/runner.py) in the `batch` priority class. The runner
    starts with the server (pantheon_site/asgi.py), not here: ready() runs for every
    management command."""

    name = "wire.batches"
    label = "batches_api"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from observability.views import add_section
        from wire.batches import progress

        add_section("batches", progress.stats)
