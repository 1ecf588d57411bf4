"""EngineRequest's outbox: a step's token events leave together and before anything sent
after them (engine/serving/records.py)."""

from engine.serving.records import EngineRequest
from engine.types import GenerationRequest, SamplingParams


def test_posted_events_leave_in_one_hand_over_before_a_sent_one():
    handed: list = []
    req = EngineRequest(GenerationRequest("m", (1, 2), SamplingParams()), emit=handed.append)
    req.emit_many = lambda events: handed.append(tuple(events))
    req.post("a")
    req.post("b")
    assert handed == []  # nothing leaves before the flush
    req.send("error")
    assert handed == [("a", "b"), "error"]
    req.flush()  # nothing left: no empty hand-over
    assert handed == [("a", "b"), "error"]


def test_without_emit_many_each_event_is_emitted_in_order():
    handed: list = []
    req = EngineRequest(GenerationRequest("m", (1,), SamplingParams()), emit=handed.append)
    for event in "xyz":
        req.post(event)
    req.flush()
    assert handed == ["x", "y", "z"]
