from django.apps import AppConfig


class OperatorsConfig(AppConfig):
    """Operator routes under /admin/... and the Django admin console (not yet written)."""

    name = "operators"
    default_auto_field = "django.db.models.BigAutoField"
