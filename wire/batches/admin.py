"""The console's batches: each with its progress, and a cancel action (the runner stops
its lines within a step; what finished is kept)."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from wire.batches import runner, store
from wire.batches.models import Batch
from wire.batches.progress import percent_done


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ("id", "namespace", "endpoint", "status", "progress", "created")
    list_filter = ("status", "endpoint")
    search_fields = ("id", "namespace", "input_file_id")
    actions = ("cancel_batches",)
    readonly_fields = [f.name for f in Batch._meta.fields]

    @admin.display(description="progress")
    def progress(self, batch: Batch) -> str:
        percent = percent_done(batch)
        return format_html(
            '<progress max="100" value="{}"></progress> {}/{} ({} failed)',
            percent,
            batch.done,
            batch.total,
            batch.failed,
        )

    @admin.action(description="Cancel the selected batches")
    def cancel_batches(self, request, queryset) -> None:
        n = store.cancel_by_operator(queryset.values_list("id", flat=True))
        runner.wake()
        self.message_user(request, f"{n} batch(es) cancelling")

    def has_add_permission(self, request) -> bool:
        return False
