"""The sessions page of the operator console (/console/): every session the engines hold,
the ones spilled to disk at the last shutdown and the spill files a start refused, with
release and export actions. Each row names the API key namespace that owns its session.

The rows mirror the engines (sessions.records); the page reconciles them before it
lists them, and nobody edits them by hand. Actions go to the engine, then the page
mirrors the result.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.http import HttpResponse

from engine import EngineError, SessionKey
from pantheon_platform.runtime import get_runtime
from sessions import records
from sessions.export import export_body
from sessions.models import SessionRecord
from sessions.spill_files import SUFFIX, file_stem, model_folder, sessions_root

State = SessionRecord.State


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@admin.register(SessionRecord)
class SessionRecordAdmin(admin.ModelAdmin):
    list_display = [
        "model_name",
        "session_id",
        "namespace",
        "state",
        "tokens",
        "conversations",
        "kv_size",
        "created",
        "last_used",
    ]
    list_filter = ["state", "model_name", "namespace"]
    search_fields = ["session_id", "model_name", "namespace"]
    actions = ["release_selected", "export_selected"]

    # Read-only: the rows mirror the engines.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="KV size", ordering="kv_bytes")
    def kv_size(self, obj: SessionRecord) -> str:
        return _bytes(obj.kv_bytes)

    def changelist_view(self, request, extra_context=None):
        if request.method == "GET":  # a POST acts on the rows the operator saw
            records.sync_now()  # the engines, as of now
        return super().changelist_view(request, extra_context)

    # --- actions ---

    @admin.action(description="Release selected sessions")
    def release_selected(self, request, queryset):
        services = get_runtime().services()
        released = 0
        for row in queryset:
            svc = services.get(row.model_name)
            if row.state in (State.SPILLED, State.REJECTED):
                if row.state == State.SPILLED:  # not restored at the next start either
                    _delete_spill_files(row)
                records.forget(row.model_name, _key(row))
                released += 1
            elif svc is None:
                self.message_user(
                    request,
                    f"{row.session_id}: model {row.model_name!r} is not loaded.",
                    messages.WARNING,
                )
            else:
                svc.release_session(_key(row))
                released += 1
        records.sync_now()
        self.message_user(request, f"Released {released} session(s).", messages.SUCCESS)

    @admin.action(description="Export selected session")
    def export_selected(self, request, queryset):
        rows = list(queryset[:2])
        if len(rows) != 1:
            self.message_user(request, "Select exactly one session to export.", messages.ERROR)
            return None
        row = rows[0]
        svc = get_runtime().services().get(row.model_name)
        if svc is None:
            self.message_user(
                request,
                f"{row.session_id}: model {row.model_name!r} is not loaded.",
                messages.ERROR,
            )
            return None
        try:
            exported = svc.export_session(_key(row))
        except EngineError as exc:  # SessionNotFound, SessionBusy
            self.message_user(request, f"{row.session_id}: {exc}", messages.ERROR)
            return None
        response = HttpResponse(json.dumps(export_body(exported)), content_type="application/json")
        name = f"session-{file_stem(_key(row))[:12]}.json"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response


def _key(row: SessionRecord) -> SessionKey:
    """The engine's key of a row's session: its id in its owner's namespace."""
    return SessionKey(row.session_id, row.namespace)


def _delete_spill_files(row: SessionRecord) -> None:
    folder = model_folder(sessions_root(), row.model_name)
    for path in folder.glob(f"{file_stem(_key(row))}-*{SUFFIX}"):
        path.unlink(missing_ok=True)
