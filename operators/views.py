"""Operator routes under /admin/...: load, unload, pin, aliases, the live instances, the
dies and the model files an operator may load.

Sync views on purpose: under ASGI Django runs each one in its own worker thread, so a
load (seconds) or an unload waiting for a generation to finish never blocks the event
loop that streams completions. Validate, call the runtime, render.
"""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import APIView

from operators import config, files
from operators.rows import model_row, model_rows
from operators.serializers import (
    NAME_MAX,
    AliasRequest,
    LoadRequest,
    NameRequest,
    PinRequest,
    load_spec,
    validated,
)
from pantheon_platform import live_settings, shutdown
from pantheon_platform.errors import ApiError, invalid_request
from pantheon_platform.request_log import note
from pantheon_platform.runtime import (
    Conflict,
    InsufficientMemory,
    InvalidOption,
    NotFound,
    OperationFailed,
    OperatorError,
    PathNotAllowed,
    dies_listing,
    get_runtime,
)
from pantheon_platform.strict_json import parse_json_object

_STATUS = {
    InvalidOption: 400,
    PathNotAllowed: 403,
    NotFound: 404,
    Conflict: 409,
    InsufficientMemory: 507,
    OperationFailed: 500,
}


def refused(exc: OperatorError, type_: str, *, not_found_type: str | None = None) -> ApiError:
    """The contract's status for a runtime refusal; the route names the error type."""
    status = next(code for cls, code in _STATUS.items() if isinstance(exc, cls))
    if status == 404 and not_found_type:
        type_ = not_found_type
    return ApiError(status, str(exc), type_)


class AdminModelsView(APIView):
    """GET /admin/models: one row per live instance, with the operator-only fields, and
    one per model loading (status "loading", its `progress`)."""

    def get(self, request):
        return Response({"object": "list", "data": model_rows(get_runtime())})


class LoadView(APIView):
    """POST /admin/models/load. Loads run one at a time: a second waits for the first."""

    def post(self, request):
        spec = load_spec(validated(LoadRequest, request.body))
        note(request, model=spec.name)
        try:
            info = get_runtime().load(spec)
        except OperatorError as exc:
            raise refused(exc, "load_failed") from None
        return Response(model_row(info))


class UnloadView(APIView):
    """POST /admin/models/unload: answers once in-flight generations have finished."""

    def post(self, request):
        name = validated(NameRequest, request.body)["name"]
        note(request, model=name)
        try:
            result = get_runtime().unload(name)
        except OperatorError as exc:
            raise refused(exc, "unload_failed") from None
        body = {"unloaded": result.name, "drained": result.drained}
        if not result.drained:
            body["in_flight"] = result.in_flight
        return Response(body)


class PinView(APIView):
    """POST /admin/models/pin {"name", "pinned"}: pinned models are never evicted."""

    def post(self, request):
        data = validated(PinRequest, request.body)
        try:
            info = get_runtime().set_pinned(data["name"], data["pinned"])
        except OperatorError as exc:
            raise refused(exc, "pin_failed", not_found_type="model_not_found") from None
        return Response({"name": info.name, "pinned": info.pinned})


class AliasesView(APIView):
    """GET /admin/aliases, POST /admin/aliases {"alias", "target"}."""

    def get(self, request):
        return Response({"object": "list", "data": _alias_rows()})

    def post(self, request):
        data = validated(AliasRequest, request.body)
        try:
            get_runtime().set_alias(data["alias"], data["target"])
        except OperatorError as exc:
            type_ = "alias_conflict" if isinstance(exc, Conflict) else "invalid_alias"
            raise refused(exc, type_) from None
        return Response({"alias": data["alias"], "target": data["target"]})


class AliasView(APIView):
    """DELETE /admin/aliases/{alias}."""

    def delete(self, request, alias: str):
        if len(alias) > NAME_MAX:
            raise invalid_request(f"alias: at most {NAME_MAX} characters")
        try:
            get_runtime().delete_alias(alias)
        except OperatorError as exc:
            raise refused(exc, "alias_not_found") from None
        return Response({"deleted": alias})


def _alias_rows() -> list[dict]:
    rt = get_runtime()
    served = rt.services()
    rows = []
    for alias, target in sorted(rt.aliases().items()):
        resolves_to = rt.follow(alias)
        rows.append(
            {
                "alias": alias,
                "target": target,
                "resolves_to": resolves_to,
                "loaded": resolves_to in served,
            }
        )
    return rows


class DiesView(APIView):
    """GET /admin/dies: empty with n_dies 0 on a host without accelerator dies."""

    def get(self, request):
        return Response(dies_listing())


class AvailableView(APIView):
    """GET /admin/models/available: the GGUF files under PANTHEON_MODEL_DIRS."""

    def get(self, request):
        return Response({"object": "list", "data": files.available_models(get_runtime())})


class ConfigView(APIView):
    """GET /admin/config: every setting, live and read-only. PATCH /admin/config
    {"name": value, ...}: change live settings (null: back to the environment's value);
    all checked before any is stored, stored in the database, in effect for the next
    request, and audited on the request's access-log line ({name: [old, new]})."""

    def get(self, request):
        return Response(config.document())

    def patch(self, request):
        changes = config.checked_changes(parse_json_object(request.body))
        moved = live_settings.update(changes)
        audit = {name: [old, new] for name, (old, new) in moved.items() if old != new}
        note(request, config=audit)
        return Response(config.document())


class ShutdownView(APIView):
    """POST /admin/shutdown: the graceful drain SIGTERM starts (pantheon_platform/
    shutdown.py): new completions get 503, in-flight ones finish, then the process exits
    0. Answers 202 at once; again while draining."""

    def post(self, request):
        if not shutdown.request_shutdown():
            raise ApiError(
                503,
                "this process is not a Daphne server (nothing would stop it); stop it "
                "with its own signal",
                "shutdown_unavailable",
            )
        return Response(
            {
                "shutting_down": True,
                "in_flight": shutdown.in_flight(),
                "drain_timeout_s": live_settings.value("drain_timeout_s"),
            },
            status=202,
        )
