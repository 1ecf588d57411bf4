"""Models on dies, through the operator routes: the `dies` load option, /admin/dies with
each die's budget and what our allocations hold there, admission against a die's budget
(507), and chat served by a model split across dies. The dies are host dies
(kernels.devices.dies.host_dies: the die logic, engine threads included, with xp = numpy);
on a GPU the same routes run on CUDA dies (not yet run there)."""

from __future__ import annotations

import jsonschema
import pytest

import kernels
from kernels.devices import dies
from operators.openapi import _INSTANCE
from tests.operators.helpers import error_of
from tests.operators.test_operator_routes import HI, UNLOAD, load
from wire.meta.openapi import _MODEL_ENTRY

GIB = 1 << 30
RESERVE = 1 << 20


@pytest.fixture
def two_dies():
    with dies.use_manager(dies.DieManager(dies.host_dies(2, GIB, RESERVE))) as manager:
        yield manager


def test_the_dies_route_lists_each_die_with_its_budget(api, two_dies):
    assert kernels.dies_visible() == 2
    assert kernels.backend_name() == "cpu"  # host dies: this process still runs on the CPU
    assert api.get("/").json()["dies_visible"] == 2
    body = api.get("/admin/dies").json()
    assert body == {
        "object": "list",
        "n_dies": 2,
        "data": [
            {
                "die": i,
                "card": i,
                "model": "",
                "n_models": 0,
                "vram_budget": GIB - RESERVE,
                "vram_used": 0,
            }
            for i in (0, 1)
        ],
    }


def test_a_model_split_across_two_dies_serves_chat_and_frees_them(api, rt, model_dir, two_dies):
    response = load(api, name="split", dies=[0, 1])
    assert response.status_code == 200, response.content
    row = response.json()
    assert row["dies"] == [0, 1]
    assert "attention" not in row  # no pass has reached an attention layer yet
    listed = {d["die"]: d for d in api.get("/admin/dies").json()["data"]}
    assert [listed[i]["model"] for i in (0, 1)] == ["split", "split"]
    assert [listed[i]["n_models"] for i in (0, 1)] == [1, 1]
    used = [listed[i]["vram_used"] for i in (0, 1)]
    assert all(u > 0 for u in used)
    svc = rt.services()["split"]
    assert sum(used) == svc.memory_bytes  # every byte the model holds is on its dies
    assert [s.model.layer_range for s in svc.model.stages] == [range(0, 1), range(1, 2)]

    chat = api.post(
        "/v1/chat/completions",
        {"model": "split", "messages": HI, "max_tokens": 4, "temperature": 0},
    )
    assert chat.status_code == 200, chat.content
    assert chat.json()["usage"]["completion_tokens"] >= 1
    # Attention residency, now that passes went through: every layer on its die.
    (served,) = api.get("/v1/models").json()["data"]
    assert served["attention"] == {"ondie": 2, "host": 0, "total": 2}
    (operator,) = api.get("/admin/models").json()["data"]
    assert operator["attention"] == {
        "ondie": 2,
        "host": 0,
        "total": 2,
        "gave_up": 0,
        "impossible": 0,
        "host_engagements": 0,
        "ring_alloc_failures": 0,
    }
    assert "graphs" not in served  # no CUDA graph slots on this backend: omitted
    # Both rows as the OpenAPI document describes them.
    jsonschema.validate(operator, _INSTANCE)
    jsonschema.validate(served, _MODEL_ENTRY)

    # A second model on die 1 only: both listed there, die 0 unchanged.
    assert load(api, name="one", path="other.gguf", dies=[1]).json()["dies"] == [1]
    listed = {d["die"]: d for d in api.get("/admin/dies").json()["data"]}
    assert listed[0]["vram_used"] == used[0] and listed[0]["n_models"] == 1
    assert listed[1]["n_models"] == 2 and listed[1]["vram_used"] > used[1]

    for name in ("split", "one"):
        assert api.post(UNLOAD, {"name": name}).status_code == 200
    assert all(d["vram_used"] == 0 for d in api.get("/admin/dies").json()["data"])


def test_a_split_model_answers_as_the_same_model_on_one_die(api, rt, model_dir, two_dies):
    load(api, name="split", dies=[0, 1])
    load(api, name="whole", dies=[1])
    body = {"messages": HI, "max_tokens": 6, "temperature": 0, "logprobs": True}
    texts = [
        api.post("/v1/chat/completions", {**body, "model": name}).json()["choices"][0]
        for name in ("split", "whole")
    ]
    assert texts[0]["message"] == texts[1]["message"]
    assert texts[0]["logprobs"] == texts[1]["logprobs"]  # the same bits, not just tokens


@pytest.mark.parametrize(
    ("dies_", "why"),
    [([2], "die 2 is not visible"), ([1, 1], "twice")],
)
def test_dies_this_server_does_not_have_are_400(api, rt, model_dir, two_dies, dies_, why):
    assert why in error_of(load(api, dies=dies_), 400, "load_failed")
    assert rt.states() == {}


def test_quantize_on_dies_is_refused(api, rt, model_dir, two_dies):
    assert "quantize" in error_of(load(api, dies=[0], quantize=True), 400, "load_failed")


def test_admission_on_a_die_is_507_when_its_budget_is_full(api, rt, model_dir):
    small = dies.DieManager(dies.host_dies(2, total_bytes=64 << 10, reserve=0))
    with dies.use_manager(small):
        message = error_of(load(api, dies=[0], ctx_cap=256), 507, "load_failed")
        assert "die 0" in message and "budget" in message
        assert rt.states() == {}
        assert all(d["vram_used"] == 0 for d in api.get("/admin/dies").json()["data"])


def test_the_cuda_backend_puts_a_model_on_die_0(api, rt, model_dir, two_dies, settings):
    settings.PANTHEON_ENGINE_OPTIONS = {**settings.PANTHEON_ENGINE_OPTIONS, "backend": "cuda"}
    assert load(api).json()["dies"] == [0]
    assert [d["n_models"] for d in api.get("/admin/dies").json()["data"]] == [1, 0]


def test_the_cuda_backend_without_a_die_fails_the_load_clearly(api, rt, model_dir, settings):
    if kernels.dies_visible():
        pytest.skip("this host has accelerator dies")
    settings.PANTHEON_ENGINE_OPTIONS = {**settings.PANTHEON_ENGINE_OPTIONS, "backend": "cuda"}
    message = error_of(load(api), 500, "load_failed")
    assert "die 0 is not visible" in message and "sees 0" in message


def test_graph_slots_are_reported_once_exercised(api, rt, model_dir, two_dies, monkeypatch):
    """Decode steps through graph slots (the replay path of kernels/cuda/graphs.py with
    xp = numpy: tests/engine/models/test_graphed_decode.py): both rows carry `graphs`."""
    from engine.loading import model_load
    from tests.engine.models.test_graphed_decode import GraphedXp

    monkeypatch.setattr(model_load, "die_backend", lambda die: GraphedXp(die.xp))
    load(api, name="graphed", dies=[0, 1])
    assert "graphs" not in api.get("/v1/models").json()["data"][0]  # nothing exercised yet
    body = {"model": "graphed", "messages": HI, "max_tokens": 4, "temperature": 0}
    assert api.post("/v1/chat/completions", body).status_code == 200
    (served,) = api.get("/v1/models").json()["data"]
    # One bucket (one row a step) per stage: the first step direct, then captured.
    assert served["graphs"] == {"live": 2, "total": 2, "failed": 0, "ineligible": 0, "pending": 0}
    (operator,) = api.get("/admin/models").json()["data"]
    assert operator["graphs"]["captures"] == 2 and operator["graphs"]["capture_failures"] == 0
    assert operator["graphs"]["segment"] == served["graphs"]
    jsonschema.validate(operator, _INSTANCE)
    jsonschema.validate(served, _MODEL_ENTRY)
