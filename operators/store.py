"""The registry's store in the database: pantheon_platform.runtime calls it, one transaction per
change, so that a restart loads exactly what was loaded when the server stopped."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from operators.models import Alias, ServedModel
from pantheon_platform.runtime import LoadSpec, Store

OPTIONS = (
    "path",
    "ctx_cap",
    "max_sessions",
    "max_concurrent",
    "reasoning_budget",
    "quantize",
    "chat_template",
    "pooling",
    "draft_model",
    "kv_dtype",
)


def spec_of(row: ServedModel) -> LoadSpec:
    return LoadSpec.of(
        name=row.name,
        dies=tuple(row.dies or ()),
        pinned=row.pinned,
        **{key: getattr(row, key) for key in OPTIONS},
    )


class DatabaseStore(Store):
    def startup(self, seed: list[LoadSpec]) -> tuple[list[LoadSpec], dict[str, str]]:
        with transaction.atomic():
            # The environment (PANTHEON_MODELS) only ever fills an empty table.
            if not ServedModel.objects.exists():
                for spec in seed:
                    ServedModel.objects.create(**_fields(spec), should_load=True)
            rows = ServedModel.objects.filter(should_load=True)
            aliases = dict(Alias.objects.values_list("alias", "target"))
            return [spec_of(row) for row in rows], aliases

    def loaded(self, spec: LoadSpec) -> None:
        with transaction.atomic():
            ServedModel.objects.update_or_create(
                name=spec.name,
                defaults={
                    **_fields(spec),
                    "should_load": True,
                    "last_error": "",
                    "loaded_at": timezone.now(),
                },
            )

    def unloaded(self, name: str) -> None:
        with transaction.atomic():
            ServedModel.objects.filter(name=name).update(should_load=False, last_error="")

    def failed(self, spec: LoadSpec, error: str) -> None:
        # Only rows that exist: a refused load of a new name leaves nothing behind.
        with transaction.atomic():
            ServedModel.objects.filter(name=spec.name).update(last_error=error)

    def pinned(self, name: str, pinned: bool) -> None:
        with transaction.atomic():
            ServedModel.objects.filter(name=name).update(pinned=pinned)

    def alias_set(self, alias: str, target: str) -> None:
        with transaction.atomic():
            Alias.objects.update_or_create(alias=alias, defaults={"target": target})

    def alias_deleted(self, alias: str) -> None:
        with transaction.atomic():
            Alias.objects.filter(alias=alias).delete()


def _fields(spec: LoadSpec) -> dict:
    return {
        "name": spec.name,
        "dies": list(spec.config.dies),
        "pinned": spec.pinned,
        **{key: getattr(spec.config, key) for key in OPTIONS},
    }
