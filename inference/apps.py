from django.apps import AppConfig


class InferenceConfig(AppConfig):
    """Client routes (/, /v1/...). Models are NOT loaded here: ready() also runs for
    `migrate` and every management command. pantheon_site/asgi.py starts the loading."""

    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"
