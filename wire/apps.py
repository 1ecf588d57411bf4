from django.apps import AppConfig


class WireConfig(AppConfig):
    """Client routes (/, /v1/..., /api/...): every wire format over the engine. Models are
    NOT loaded here: ready() also runs for `migrate` and every management command.
    pantheon_site/asgi.py starts the loading."""

    name = "wire"
    default_auto_field = "django.db.models.BigAutoField"
