"""GET /, GET /v1/models, OPTIONS, the JSON 404/405 and the CORS header."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.conf import settings
from django.test import Client

import kernels
from engine.types import ModelConfig
from pantheon_platform.runtime import LOADING, ModelState, build_id

NOT_FOUND = b'{"error":{"message":"unknown route","type":"not_found","code":null}}'


@pytest.fixture
def http() -> Client:
    return Client(enforce_csrf_checks=True)  # as a real client: no CSRF token


def test_health_reports_service_backend_and_build(http, empty_runtime):
    response = http.get("/")
    assert response.status_code == 200
    body = response.json()
    assert body["service"] == "pantheon"
    assert body["status"] == "ok"
    assert body["backend"] == kernels.backend_name()
    assert body["build"] == build_id()
    assert body["accelerator"] is False
    assert body["dies_visible"] == kernels.dies_visible()
    assert body["models"] == {}
    # What the products compute with, said: float32 unless PANTHEON_ACTIVATIONS opts in.
    if body["kernel"] == "cpu":
        assert body["kernel_activations"] == kernels.kernel_activations() == "float32"
    else:
        assert "kernel_activations" not in body


def test_health_says_what_is_still_loading(http, empty_runtime):
    empty_runtime._states["big-model"] = ModelState(LOADING)
    body = http.get("/").json()
    assert body["models"] == {"big-model": "loading"}
    assert "load_errors" not in body


def test_health_says_which_model_failed_to_load_and_why(http, empty_runtime, tmp_path):
    missing = tmp_path / "missing.gguf"
    empty_runtime.start_loading([ModelConfig(name="broken", path=str(missing))])
    assert empty_runtime.wait_loaded(timeout=60)
    body = http.get("/").json()
    assert body["status"] == "ok"
    assert body["models"] == {"broken": "failed"}
    assert "missing.gguf" in body["load_errors"]["broken"]


def test_health_lists_a_loaded_model(http, served):
    body = http.get("/").json()
    assert body["models"] == {"smollm2-135m-instruct": "loaded"}
    assert body["accelerator"] is False  # the numpy engine


def test_build_is_a_short_commit_or_unknown():
    build = build_id()
    assert build == "unknown" or len(build.removesuffix("-dirty")) == 12


def test_models_lists_served_models_with_their_limits(http, served, smollm2_service):
    response = http.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert body["backend"] == kernels.backend_name()
    assert body["build"] == build_id()
    assert body["data"] == [
        {
            "id": "smollm2-135m-instruct",
            "object": "model",
            "created": smollm2_service.created,
            "owned_by": "pantheon",
            "max_sessions": smollm2_service.max_sessions,
            "max_concurrent": smollm2_service.max_concurrent,
            "tool_choice_required_with_thinking": False,  # ChatML has no think block
            "context_window": smollm2_service.context_window,
        }
    ]
    assert body["data"][0]["context_window"] == 8192


def test_models_is_empty_while_nothing_is_loaded(http, empty_runtime):
    assert http.get("/v1/models").json()["data"] == []


@pytest.mark.parametrize("path", ["/nope", "/v1/models/", "/v1/edits", "/admin/nope", "/v2"])
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_unknown_route_is_the_exact_json_404(http, path, method):
    response = getattr(http, method)(path)
    assert response.status_code == 404
    assert response.content == NOT_FOUND
    assert response["Content-Type"] == "application/json"


@pytest.mark.parametrize("path", ["/", "/v1/models", "/v1/chat/completions", "/no/such/route"])
def test_options_on_any_path_is_an_empty_object(http, path):
    response = http.options(path, HTTP_ACCESS_CONTROL_REQUEST_HEADERS="content-type")
    assert response.status_code == 200
    assert json.loads(response.content) == {}
    assert response["Access-Control-Allow-Origin"] == "*"
    assert response["Access-Control-Allow-Headers"] == "content-type"


@pytest.mark.parametrize(
    "method,path,status",
    [
        ("post", "/", 405),
        ("put", "/v1/models", 405),
        ("get", "/v1/chat/completions", 405),
        ("delete", "/v1/chat/completions", 405),
    ],
)
def test_wrong_method_on_a_known_route_is_405_in_the_error_shape(http, method, path, status):
    response = getattr(http, method)(path)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == "method_not_allowed"
    assert error["code"] is None
    assert error["message"]
    assert "Allow" in response


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("get", "/", None),
        ("get", "/v1/models", None),
        ("get", "/missing", None),
        ("options", "/v1/chat/completions", None),
        ("post", "/v1/models", None),
        ("post", "/v1/chat/completions", "not json"),
        ("post", "/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}]}'),
    ],
)
def test_every_response_carries_the_cors_header(http, empty_runtime, method, path, body):
    kwargs = {"data": body, "content_type": "application/json"} if body is not None else {}
    response = getattr(http, method)(path, **kwargs)
    assert response["Access-Control-Allow-Origin"] == "*"


def test_console_is_the_django_admin(http):
    response = http.get("/console/")
    assert response.status_code == 302  # to the admin login
    assert response["Location"].startswith("/console/login/")


def test_pantheon_backend_prints_one_lowercase_token():
    result = subprocess.run(
        [sys.executable, "-m", "pantheon_site.cli", "--backend"],
        capture_output=True,
        text=True,
        check=True,
        cwd=settings.BASE_DIR,
    )
    assert result.stdout == kernels.backend_name() + "\n"
    assert result.stdout.strip() in {"cpu", "cuda"}
