"""A batch and its lines. The lines are the runner's durable progress: a line is
pending, running (in flight now: redone after a crash) or done (its output line kept
here and appended to the output or error file; never run again)."""

from __future__ import annotations

from django.db import models

# OpenAI's status machine.
VALIDATING, FAILED, IN_PROGRESS, FINALIZING = "validating", "failed", "in_progress", "finalizing"
COMPLETED, EXPIRED, CANCELLING, CANCELLED = "completed", "expired", "cancelling", "cancelled"
STATUSES = (VALIDATING, FAILED, IN_PROGRESS, FINALIZING, COMPLETED, EXPIRED, CANCELLING, CANCELLED)
ENDED = (FAILED, COMPLETED, EXPIRED, CANCELLED)
# A line's state.
PENDING, RUNNING, DONE = "pending", "running", "done"


class Batch(models.Model):
    id = models.CharField(primary_key=True, max_length=64)
    namespace = models.CharField(max_length=64, help_text="Whose batch (the key's namespace).")
    endpoint = models.CharField(max_length=64)
    completion_window = models.CharField(max_length=16, default="24h")
    input_file_id = models.CharField(max_length=64)
    output_file_id = models.CharField(max_length=64, null=True, blank=True)
    error_file_id = models.CharField(max_length=64, null=True, blank=True)
    status = models.CharField(max_length=16, default=VALIDATING, db_index=True)
    errors = models.JSONField(null=True, blank=True)  # [{code, message, param, line}]
    metadata = models.JSONField(null=True, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)  # lines answered 2xx
    failed = models.PositiveIntegerField(default=0)  # error lines
    created = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["namespace", "created"])]
        verbose_name_plural = "batches"

    def __str__(self) -> str:
        return f"{self.id} {self.status} ({self.namespace})"

    @property
    def done(self) -> int:
        return self.completed + self.failed


class BatchLine(models.Model):
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    index = models.PositiveIntegerField()  # its line in the input file, from 0
    custom_id = models.CharField(max_length=512)
    url = models.CharField(max_length=64)  # its endpoint (a batch may mix them)
    body = models.JSONField()  # the request body, as the input line sent it
    state = models.CharField(max_length=8, default=PENDING)
    ok = models.BooleanField(default=False)  # done with a 2xx: in the output file
    result = models.JSONField(null=True, blank=True)  # the output (or error) line

    class Meta:
        ordering = ["batch", "index"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "custom_id"], name="batch_line_custom_id"),
            models.UniqueConstraint(fields=["batch", "index"], name="batch_line_index"),
        ]
        indexes = [models.Index(fields=["batch", "state"])]
