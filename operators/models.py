"""What the operator registry keeps across restarts: each model's configuration and
whether it should be loaded, and the aliases. Written by operators.store, read at start."""

from __future__ import annotations

from django.db import models


class ServedModel(models.Model):
    """One served name: the load options it was (or will be) loaded with, whether it is
    loaded again at start, and how its last load went. The console lists these rows as
    "model configs"; the engine's ModelConfig is what a load hands the engine."""

    name = models.CharField(max_length=200, unique=True, help_text="The served id.")
    path = models.CharField(max_length=4096, help_text="The GGUF file, inside a model folder.")
    ctx_cap = models.PositiveIntegerField(
        default=0, help_text="Per-session context cap in tokens (0: the engine default)."
    )
    max_sessions = models.PositiveIntegerField(default=4)
    max_concurrent = models.PositiveIntegerField(default=0, help_text="0: max_sessions.")
    reasoning_budget = models.PositiveIntegerField(default=0, help_text="0: unbounded.")
    chat_template = models.TextField(
        blank=True,
        default="",
        help_text="A chat template's text, or its file in a model folder (empty: the GGUF's).",
    )
    dies = models.JSONField(default=list, blank=True)
    quantize = models.BooleanField(default=False)
    pooling = models.CharField(
        max_length=8,
        blank=True,
        default="",
        help_text="Embeddings: mean, last, cls (empty: default).",
    )
    draft_model = models.CharField(
        max_length=4096,
        blank=True,
        default="",
        help_text="Speculation: a GGUF with the same vocabulary, inside a model folder "
        "(empty: none).",
    )
    kv_dtype = models.CharField(
        max_length=8,
        default="f32",
        choices=[("f32", "f32 (exact)"), ("f16", "f16"), ("q8_0", "q8_0")],
        help_text="KV cache type: f32 (exact), f16 (half the memory) or q8_0 (~3.8x less).",
    )
    pinned = models.BooleanField(default=False, help_text="Never evicted to make room.")
    should_load = models.BooleanField(
        default=False, help_text="Loaded when the server stops, so loaded again at start."
    )
    last_error = models.TextField(blank=True, help_text="Why the last load failed.")
    loaded_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # Start-up loads in this order: the way they were loaded before.
        ordering = ["loaded_at", "id"]
        verbose_name = "model config"

    def __str__(self) -> str:
        return self.name


class Alias(models.Model):
    """Another name a request may use for a model (or for another alias)."""

    alias = models.CharField(max_length=200, unique=True)
    target = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["alias"]
        verbose_name_plural = "aliases"

    def __str__(self) -> str:
        return f"{self.alias} -> {self.target}"


class ConfigOverride(models.Model):
    """A runtime setting an operator changed (PATCH /admin/config): it wins over the
    environment until reset (pantheon_platform.live_settings)."""

    name = models.CharField(max_length=64, unique=True)
    value = models.JSONField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} = {self.value!r}"
