"""What the console shows of each session: a mirror of the engines' session tables
(sessions.records keeps it in step), plus the sessions spilled to disk at the last
shutdown and the spill files a start refused. The engine is the truth for live ones.
A session is its model, its owner's namespace (the API key that made it) and its id: two
keys may each hold a session of the same id."""

from __future__ import annotations

from django.db import models


class SessionRecord(models.Model):
    class State(models.TextChoices):
        LIVE = "live", "live"
        BUSY = "busy", "busy (turn in flight)"
        WATCHED = "watched", "watched"
        SPILLED = "spilled", "spilled (on disk; restored at the next start)"
        REJECTED = "rejected", "rejected (spill file failed validation)"

    model_name = models.CharField(max_length=200, help_text="The served model name.")
    namespace = models.CharField(
        max_length=64,
        default="open",
        help_text='Whose session: "key:<console key id>", "env:client", "env:admin", or '
        '"open" (a server with no API key).',
    )
    session_id = models.CharField(max_length=256)
    conversations = models.PositiveIntegerField(default=0)
    tokens = models.PositiveIntegerField(
        default=0, help_text="Held by the most recently used conversation."
    )
    total_tokens = models.PositiveIntegerField(default=0)
    kv_bytes = models.PositiveBigIntegerField(default=0)
    created = models.DateTimeField()
    last_used = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.LIVE)
    detail = models.TextField(blank=True, help_text="Why a spill file was rejected.")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-last_used", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["model_name", "namespace", "session_id"],
                name="unique_session_per_model_namespace",
            )
        ]
        verbose_name = "session"

    def __str__(self) -> str:
        return f"{self.model_name}: {self.session_id} ({self.namespace})"
