"""A stored file: an upload (purpose "batch") or a batch's output or error file. Its
bytes are on disk (wire/files/storage.py: PANTHEON_FILES_DIR/<id>); the row says whose
it is (the API key's namespace, pantheon_platform.tenancy) and what it holds."""

from __future__ import annotations

from django.db import models


class StoredFile(models.Model):
    id = models.CharField(primary_key=True, max_length=64)
    namespace = models.CharField(
        max_length=64,
        help_text='Whose file: "key:<console key id>", "env:client", "env:admin", or "open".',
    )
    filename = models.CharField(max_length=512)
    purpose = models.CharField(max_length=32)  # batch, batch_output
    bytes = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["namespace", "created"])]
        verbose_name = "stored file"

    def __str__(self) -> str:
        return f"{self.id} {self.filename} ({self.namespace})"
