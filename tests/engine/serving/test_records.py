"""EngineRequest's outbox: a step's token events leave together and before anything sent
after them (engine/serving/records.py)."""

from engine.serving.records import EngineRequest
from engine.types import GenerationRequest, SamplingParams, TokenEvent, TokenLogprob


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


def token(text: str, ids: tuple, index: int = 0, **fields) -> TokenEvent:
    return TokenEvent(text=text, token_ids=ids, index=index, **fields)


def test_a_choices_answer_text_of_one_step_leaves_as_one_event():
    handed: list = []
    req = EngineRequest(GenerationRequest("m", (1,), SamplingParams()), emit=handed.append)
    lp = TokenLogprob(token="b", logprob=-0.5, bytes=(98,), top=())
    req.post(token("a", (7,)))
    req.post(token("b", (8,), logprobs=(lp,)))
    req.post(token("c", (9,)))
    req.flush()
    assert handed == [token("abc", (7, 8, 9), logprobs=(lp,))]


def test_events_whose_order_a_renderer_reads_stay_apart():
    handed: list = []
    req = EngineRequest(GenerationRequest("m", (1,), SamplingParams()), emit=handed.append)
    apart = [
        token("a", (1,)),
        token("b", (2,), index=1),  # another choice's
        token("", (3,), index=1, reasoning="hm"),  # a think block's
        token("c", (4,), index=1),
        token("d", (5,), index=1, tool_calls=("call",)),  # a tool-call delta's
        "finish",
        token("e", (6,), index=1),
    ]
    for event in apart:
        req.post(event)
    req.flush()
    assert handed == apart
