"""ApiKey: a key made in the console. The key itself is shown once, when it is made, and
never stored: only its sha256 (to find it) and its first characters (to tell keys apart)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from pantheon_platform.routes import SCOPES


def validate_scopes(value) -> None:
    if not isinstance(value, list) or not value:
        raise ValidationError("scopes must be a non-empty list")
    unknown = [s for s in value if s not in SCOPES]
    if unknown:
        raise ValidationError(f"unknown scope(s) {unknown}; known: {', '.join(SCOPES)}")


class ApiKey(models.Model):
    name = models.CharField(max_length=100, help_text="Who or what uses this key.")
    prefix = models.CharField(max_length=16, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    scopes = models.JSONField(
        default=list,
        validators=[validate_scopes],
        help_text="inference, sessions (restore/release/watch), session_export (leaks "
        "prompt content), admin, metrics (GET /metrics)",
    )
    max_concurrent = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Requests this key may have in flight at once; empty or 0: "
        "PANTHEON_KEY_MAX_CONCURRENT.",
    )
    priority = models.CharField(
        max_length=16,
        blank=True,  # empty: interactive
        default="interactive",
        choices=[("interactive", "interactive"), ("batch", "batch")],
        help_text="The class every request of this key runs in: batch work only uses the "
        "capacity interactive requests leave (the Batches API's lines are batch anyway).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked = models.BooleanField(default=False)

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...)"
