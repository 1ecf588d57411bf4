"""UsageBucket: what one key asked of one model in one hour (or, once rolled up, one day)."""

from __future__ import annotations

from django.db import models

HOUR, DAY = "hour", "day"


class UsageBucket(models.Model):
    # The key's label as the access log writes it (env:client, env:admin, console:<prefix>);
    # "" when the request needed no key (a server with none).
    key = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=255, blank=True)  # the served name; "" if none
    span = models.CharField(max_length=4, choices=[(HOUR, "hour"), (DAY, "day")])
    start = models.DateTimeField()  # UTC, the hour's (or day's) first instant
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    generated_tokens = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)  # answered with a status >= 400

    COUNTS = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "errors")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["key", "model", "span", "start"], name="one_usage_bucket"
            )
        ]
        indexes = [models.Index(fields=["span", "start"])]
        ordering = ["start", "key", "model"]

    def __str__(self) -> str:
        return f"{self.key or 'no key'} / {self.model or 'no model'} / {self.start:%Y-%m-%d %H}h"
