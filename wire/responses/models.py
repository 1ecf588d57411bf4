"""Stored responses: what `GET /v1/responses/{id}` answers and what a follow-up's
`previous_response_id` continues. Written before the answer (or the stream's last event)
leaves, so a response the client saw is never lost. Each belongs to the namespace of the
API key that made it (sessions.tenancy): another key neither reads nor deletes it.
wire/responses/storage.py bounds them: per record, per key (count and bytes), by age."""

from __future__ import annotations

from django.db import models


class StoredResponse(models.Model):
    id = models.CharField(primary_key=True, max_length=64)
    namespace = models.CharField(
        max_length=64,
        help_text='Whose response: "key:<console key id>", "env:client", "env:admin", or '
        '"open" (a server with no API key).',
    )
    model_name = models.CharField(max_length=256)
    created = models.DateTimeField(auto_now_add=True)
    # The session id (the client's string, in `namespace`) its turn ran under: a
    # follow-up runs under the same one, so the engine resumes from this turn's KV.
    session_id = models.CharField(max_length=256, null=True, blank=True)
    # The conversation up to and including this response's output, as chat messages
    # (`instructions` excluded: OpenAI does not carry them over).
    conversation = models.JSONField()
    body = models.JSONField(help_text="The response object, as the create call answered it.")
    # The record's bytes (its conversation and body as JSON): what the per-key byte cap
    # (PANTHEON_RESPONSES_MAX_BYTES_PER_KEY) sums.
    size = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["namespace", "created"])]
        verbose_name = "stored response"

    def __str__(self) -> str:
        return f"{self.id} ({self.namespace})"
