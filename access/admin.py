"""API keys in the console (/console/access/apikey/): the list (name, prefix, scopes,
created, last used, revoked), a revoke action, and the add form (name, scopes, optional
max_concurrent) that makes the key, stores only its sha256 and shows it exactly once."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import transaction

from access import keys
from access.models import ApiKey
from pantheon_platform.routes import SCOPES

SCOPE_HELP = {
    "inference": "inference: /v1/... (chat completions, models)",
    "sessions": "sessions: /session/restore, /release, /watch, /estimate",
    "session_export": "session_export: /admin/session/export (returns prompt content)",
    "metrics": "metrics: GET /metrics (Prometheus; nothing else)",
    "admin": "admin: the operator routes /admin/... (load, unload, pin, aliases)",
}


class ApiKeyForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=[(scope, SCOPE_HELP.get(scope, scope)) for scope in SCOPES],
        widget=forms.CheckboxSelectMultiple,
        help_text="What the key may call. session_export is separate: an export returns "
        "the conversation, i.e. the prompts.",
    )

    class Meta:
        model = ApiKey
        fields = ["name", "scopes", "max_concurrent", "priority", "revoked"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ["name", "prefix_shown", "scope_list", "created_at", "last_used_at", "revoked"]
    list_filter = ["revoked"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix_shown", "created_at", "last_used_at"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        if obj is None:  # the add form: the key is made on save
            return ["name", "scopes", "max_concurrent", "priority"]
        return ["name", "prefix_shown", "scopes", "max_concurrent", "priority", "revoked"] + [
            "created_at",
            "last_used_at",
        ]

    @admin.display(description="key")
    def prefix_shown(self, obj: ApiKey) -> str:
        return f"{obj.prefix}..." if obj.prefix else ""

    @admin.display(description="scopes")
    def scope_list(self, obj: ApiKey) -> str:
        return ", ".join(obj.scopes)

    def save_model(self, request, obj: ApiKey, form, change: bool) -> None:
        with transaction.atomic():
            if change:
                super().save_model(request, obj, form, change)
                return
            key = keys.generate()
            obj.prefix = key[: keys.PREFIX_CHARS]
            obj.key_hash = keys.digest(key)
            super().save_model(request, obj, form, change)
        messages.success(
            request,
            f"The new API key for “{obj.name}” is {key} — copy it now: it is not stored "
            "and will not be shown again. Send it as 'Authorization: Bearer <key>' or "
            "'x-api-key: <key>'.",
        )

    @admin.action(description="Revoke the selected API keys")
    def revoke(self, request, queryset) -> None:
        with transaction.atomic():
            count = queryset.filter(revoked=False).update(revoked=True)
        keys.forget_cache()  # update() sends no post_save
        self.message_user(request, f"Revoked {count} API key(s): they are refused from now on.")
