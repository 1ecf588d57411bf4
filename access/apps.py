from django.apps import AppConfig


class AccessConfig(AppConfig):
    """API keys (env and console) and the ASGI guard that checks them."""

    name = "access"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "API access"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from access import keys
        from access.models import ApiKey

        # "Is any console key configured?" is cached for a few seconds; a change made in
        # this process (the console) is seen at once.
        post_save.connect(keys.forget_cache, sender=ApiKey, dispatch_uid="access-keys-save")
        post_delete.connect(keys.forget_cache, sender=ApiKey, dispatch_uid="access-keys-del")
