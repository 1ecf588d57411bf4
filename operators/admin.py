"""The operator console (Django admin at /console/): model configs with live status,
load / unload / pin / unpin actions, a form to load a file from the model folders, alias
management and a read-only dies page.

Every change goes through the runtime (pantheon_platform.runtime), which checks it, applies it
to the live registry and records it (operators.store): the console never writes a
ServedModel's state or an Alias behind the registry's back.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from operators import files
from operators.models import Alias, ServedModel
from operators.rows import speculation_json
from operators.serializers import load_spec
from operators.store import spec_of
from pantheon_platform.model_files import allowed_model_path
from pantheon_platform.runtime import FAILED, NotFound, OperatorError, dies_listing, get_runtime


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _progress_bar(p) -> str:
    """A loading model's status cell: a <progress> bar, its phase and percentage."""
    percent = round(100 * p.fraction)
    return format_html(
        '<progress class="load-progress" max="100" value="{}"></progress> loading: {} {}%',
        percent,
        p.phase,
        percent,
    )


class ServedModelForm(forms.ModelForm):
    class Meta:
        model = ServedModel
        fields = [
            "name",
            "path",
            "ctx_cap",
            "max_sessions",
            "max_concurrent",
            "reasoning_budget",
            "kv_dtype",
        ]

    def clean_path(self) -> str:
        try:
            return str(allowed_model_path(self.cleaned_data["path"]))
        except PermissionError as exc:
            raise ValidationError(str(exc)) from None


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    form = ServedModelForm
    list_display = [
        "name",
        "status",
        "in_flight",
        "sessions",
        "memory",
        "context_window",
        "draft_acceptance",
        "pinned",
        "should_load",
        "path",
    ]
    list_filter = ["should_load", "pinned"]
    search_fields = ["name", "path"]
    readonly_fields = ["pinned", "should_load", "last_error", "loaded_at", "created_at"]
    actions = ["load_selected", "unload_selected", "pin_selected", "unpin_selected"]

    def get_readonly_fields(self, request, obj=None):
        # A served name is the registry's key: rename by loading under the new name.
        return self.readonly_fields + (["name"] if obj else [])

    # --- live status columns (from the registry, not the database) ---

    @admin.display(description="status")
    def status(self, obj: ServedModel) -> str:
        info = get_runtime().instance(obj.name)
        if info is not None:
            return "unloading" if info.draining else "loaded"
        state = get_runtime().states().get(obj.name)
        if state is not None and state.state == FAILED:
            return f"failed: {state.error}"
        loading = next((i for i in get_runtime().loading() if i.name == obj.name), None)
        if loading is not None and loading.progress is not None:
            return _progress_bar(loading.progress)
        if state is not None:
            return state.state
        return f"not loaded (last error: {obj.last_error})" if obj.last_error else "not loaded"

    @admin.display(description="in flight")
    def in_flight(self, obj: ServedModel):
        info = get_runtime().instance(obj.name)
        return info.svc.in_flight if info else "-"

    @admin.display(description="sessions")
    def sessions(self, obj: ServedModel):
        info = get_runtime().instance(obj.name)
        return info.svc.max_sessions if info else "-"

    @admin.display(description="memory")
    def memory(self, obj: ServedModel) -> str:
        info = get_runtime().instance(obj.name)
        return _bytes(info.svc.memory_bytes) if info else "-"

    @admin.display(description="context window (served / configured)")
    def context_window(self, obj: ServedModel) -> str:
        info = get_runtime().instance(obj.name)
        if info is None:
            return "-"
        return f"{info.svc.context_window} / {info.context_window_configured}"

    @admin.display(description="draft acceptance")
    def draft_acceptance(self, obj: ServedModel) -> str:
        """Speculative decoding: accepted / drafted tokens since the load (rows.py)."""
        info = get_runtime().instance(obj.name)
        rate = speculation_json(info.svc)["acceptance_rate"] if info else None
        return "-" if rate is None else f"{rate:.0%}"

    # --- actions ---

    @admin.action(description="Load selected models")
    def load_selected(self, request, queryset):
        for row in queryset:
            try:
                get_runtime().load(spec_of(row))
            except OperatorError as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"Loaded {row.name}.", messages.SUCCESS)

    @admin.action(description="Unload selected models (in-flight generations finish first)")
    def unload_selected(self, request, queryset):
        for row in queryset:
            try:
                result = get_runtime().unload(row.name)
            except NotFound:  # not loaded: just do not load it at the next start
                ServedModel.objects.filter(pk=row.pk).update(should_load=False)
                self.message_user(request, f"{row.name} was not loaded.", messages.INFO)
            except OperatorError as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
            else:
                note = "" if result.drained else " once its generations end"
                self.message_user(request, f"Unloaded {row.name}{note}.", messages.SUCCESS)

    @admin.action(description="Pin selected models (never evicted)")
    def pin_selected(self, request, queryset):
        self._set_pinned(request, queryset, True)

    @admin.action(description="Unpin selected models")
    def unpin_selected(self, request, queryset):
        self._set_pinned(request, queryset, False)

    def _set_pinned(self, request, queryset, pinned: bool) -> None:
        for row in queryset:
            try:
                get_runtime().set_pinned(row.name, pinned)
            except NotFound:  # not loaded: applies at its next load
                ServedModel.objects.filter(pk=row.pk).update(pinned=pinned)
            except OperatorError as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
                continue
            word = "Pinned" if pinned else "Unpinned"
            self.message_user(request, f"{word} {row.name}.", messages.SUCCESS)

    # --- saving and deleting ---

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and get_runtime().instance(obj.name) is not None:
            self.message_user(
                request,
                f"{obj.name} is loaded: the new options apply when it is next loaded.",
                messages.WARNING,
            )

    def has_delete_permission(self, request, obj=None):
        # A loaded model's record stays while it is loaded: unload it first.
        if obj is not None and get_runtime().instance(obj.name) is not None:
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request, queryset):
        loaded = [row.name for row in queryset if get_runtime().instance(row.name) is not None]
        if loaded:
            self.message_user(
                request, f"Kept {', '.join(loaded)}: unload before deleting.", messages.WARNING
            )
        queryset.exclude(name__in=loaded).delete()

    # --- custom pages: load a file, dies ---

    def get_urls(self):
        own = [
            path(
                "load-file/",
                self.admin_site.admin_view(self.load_file_view),
                name="operators_servedmodel_load_file",
            ),
            path(
                "dies/",
                self.admin_site.admin_view(self.dies_view),
                name="operators_servedmodel_dies",
            ),
        ]
        return own + super().get_urls()

    def load_file_view(self, request):
        if not self.has_change_permission(request):
            return redirect("admin:index")
        available = files.available_models(get_runtime())
        form = LoadFileForm(request.POST or None, choices=available)
        if request.method == "POST" and form.is_valid():
            data = {**form.cleaned_data, "path": form.cleaned_data["file"]}
            if not data.get("name"):  # a model on disk: its store's name, not its blob's
                found = [r for r in available if r["path"] == data["path"] and "source" in r]
                data["name"] = found[0]["name"] if found else data.get("name")
            try:
                info = get_runtime().load(load_spec(data))
            except OperatorError as exc:
                form.add_error(None, str(exc))
            else:
                self.message_user(request, f"Loaded {info.name}.", messages.SUCCESS)
                return redirect(reverse("admin:operators_servedmodel_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Load a model file",
            "form": form,
            "available": available,
        }
        return TemplateResponse(request, "admin/operators/servedmodel/load_file.html", context)

    def dies_view(self, request):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Accelerator dies",
            "dies": dies_listing(),
        }
        return TemplateResponse(request, "admin/operators/servedmodel/dies.html", context)


class LoadFileForm(forms.Form):
    """Pick one of the GGUF files under PANTHEON_MODEL_DIRS and the options to load it with."""

    file = forms.ChoiceField(label="Model file")
    name = forms.CharField(required=False, max_length=200, help_text="Default: the file name.")
    ctx_cap = forms.IntegerField(required=False, min_value=0, help_text="0: the engine default.")
    max_sessions = forms.IntegerField(required=False, min_value=0, help_text="0: the default.")
    max_concurrent = forms.IntegerField(required=False, min_value=0, help_text="0: sessions.")
    reasoning_budget = forms.IntegerField(required=False, min_value=0, help_text="0: unbounded.")
    kv_dtype = forms.ChoiceField(
        required=False,
        choices=[("f32", "f32 (exact)"), ("f16", "f16"), ("q8_0", "q8_0")],
        initial="f32",
        help_text="KV cache type: f16 halves its memory, q8_0 takes ~3.8x less "
        "(the logits move a little).",
    )
    chat_template = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="A Jinja chat template, or a file under the model folders. "
        "Empty: the GGUF's own template.",
    )
    draft_model = forms.CharField(
        required=False,
        max_length=4096,
        help_text="Speculation: a GGUF with this model's vocabulary, under the model "
        "folders. Empty: none.",
    )
    pinned = forms.BooleanField(required=False)

    def __init__(self, *args, choices: list[dict], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["file"].choices = [
            (row["path"], _file_label(row)) for row in choices if not row.get("error")
        ]


def _file_label(row: dict) -> str:
    details = [row.get("architecture", ""), row.get("quantization", "")]
    if row.get("n_params"):
        details.append(f"{row['n_params'] / 1e6:.0f}M params")
    details.append(_bytes(row["size_bytes"]))
    if row["loaded"]:
        details.append("loaded as " + ", ".join(row["loaded_as"]))
    where = f"{row['name']} from {row['source']}: " if "source" in row else ""
    return f"{where}{row['path']} ({', '.join(d for d in details if d)})"


class AliasForm(forms.ModelForm):
    class Meta:
        model = Alias
        fields = ["alias", "target"]

    def clean(self):
        data = super().clean()
        alias = data.get("alias") or (self.instance.alias if self.instance.pk else "")
        if alias and data.get("target"):
            try:
                get_runtime().check_alias(alias, data["target"])
            except OperatorError as exc:
                raise ValidationError(str(exc)) from None
        return data


@admin.register(Alias)
class AliasAdmin(admin.ModelAdmin):
    form = AliasForm
    list_display = ["alias", "target", "resolves_to", "target_loaded"]
    search_fields = ["alias", "target"]

    def get_readonly_fields(self, request, obj=None):
        return ["alias"] if obj else []

    @admin.display(description="resolves to")
    def resolves_to(self, obj: Alias) -> str:
        return get_runtime().follow(obj.alias)

    @admin.display(description="loaded", boolean=True)
    def target_loaded(self, obj: Alias) -> bool:
        return get_runtime().follow(obj.alias) in get_runtime().services()

    def save_model(self, request, obj, form, change):
        try:
            get_runtime().set_alias(obj.alias, obj.target)  # the registry's store writes the row
        except OperatorError as exc:  # changed since the form was validated
            self.message_user(request, f"{obj.alias}: {exc}", messages.ERROR)
            return
        saved = Alias.objects.filter(alias=obj.alias).first()
        if saved is None:  # a registry without the database store
            super().save_model(request, obj, form, change)
        else:
            obj.pk = saved.pk

    def delete_model(self, request, obj):
        self._delete(obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self._delete(obj)

    @staticmethod
    def _delete(obj: Alias) -> None:
        try:
            get_runtime().delete_alias(obj.alias)
        except NotFound:  # the registry never had it
            pass
        Alias.objects.filter(pk=obj.pk).delete()
