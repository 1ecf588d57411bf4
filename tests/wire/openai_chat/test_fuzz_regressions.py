"""Cases schemathesis found against the real server (tests/e2e/test_schemathesis.py), kept
as plain in-process tests so they stay fixed without a fuzz run."""

from __future__ import annotations

import json

import pytest

from tests.operators.helpers import Api

LOAD = "/admin/models/load"


@pytest.fixture
def api() -> Api:
    return Api()


@pytest.fixture
def model_dir(tmp_path, settings):
    folder = (tmp_path / "models").resolve()
    folder.mkdir()
    settings.PANTHEON_MODEL_DIRS = [folder]
    return folder


@pytest.mark.parametrize(
    "path",
    [
        "0" * 4000,  # relative: a file name longer than the filesystem allows (ENAMETOOLONG)
        "/" + "0" * 4000,  # the same, absolute
        "a/" * 2000 + "x.gguf",  # a path longer than PATH_MAX
        "tiny\x00.gguf",  # a NUL byte
        "/tmp/tiny\x00.gguf",
    ],
)
def test_a_load_of_an_impossible_path_is_a_4xx(api, empty_runtime, model_dir, path):
    response = api.post(LOAD, {"path": path})
    assert 400 <= response.status_code < 500, response.content
    assert set(response.json()["error"]) >= {"message", "type", "code"}


@pytest.mark.parametrize(
    "template", ["0" * 4000, "/" + "0" * 4000, "tmpl\x00.jinja", "a/" * 2000 + "x.jinja"]
)
def test_a_chat_template_file_with_an_impossible_path_is_a_4xx(
    api, empty_runtime, model_dir, template
):
    from tests.tiny_gguf import write_tiny_llama

    write_tiny_llama(model_dir / "tiny.gguf")
    response = api.post(LOAD, {"path": "tiny.gguf", "chat_template": template})
    assert 400 <= response.status_code < 500, response.content


def test_an_estimate_never_answers_infinity(api, served):
    # upload_bps = the smallest float: blob_bytes / upload_bps overflows to inf, which
    # Python's json writes as `Infinity` (not JSON).
    response = api.get("/session/estimate?tokens=1&upload_bps=5e-324")
    assert response.status_code in (200, 400), response.content
    json.loads(response.content, parse_constant=_refuse)


def test_an_estimate_with_huge_numbers_stays_json(api, served):
    big = (1 << 63) - 1
    response = api.get(f"/session/estimate?tokens={big}&blob_bytes={big}&upload_bps=1e-300")
    assert response.status_code in (200, 400), response.content
    json.loads(response.content, parse_constant=_refuse)


def _refuse(name):
    raise AssertionError(f"{name} in a JSON response")
