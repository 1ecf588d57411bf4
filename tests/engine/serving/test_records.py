"""EngineRequest's outbox: a step's token events leave together and before anything sent
after them, at most once per stream interval (engine/serving/records.py)."""

import time

from engine.serving.records import EngineRequest, hand_over, hand_over_due
from engine.types import GenerationRequest, SamplingParams, TokenEvent, TokenLogprob


class Loop:
    """An event loop as the engine thread sees it: call_soon_threadsafe, here run at once
    and counted (each is a write to the loop's self-pipe and a wake-up)."""

    def __init__(self, closed: bool = False) -> None:
        self.wake_ups = 0
        self.closed = closed

    def call_soon_threadsafe(self, fn, *args):
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.wake_ups += 1
        fn(*args)


def handed_over(loop: Loop, handed: list) -> EngineRequest:
    req = EngineRequest(GenerationRequest("m", (1, 2), SamplingParams()), emit=handed.append)
    req.handoff = (loop, lambda events: handed.append(tuple(events)))
    return req


def test_posted_events_leave_in_one_hand_over_before_a_sent_one():
    handed: list = []
    req = handed_over(Loop(), handed)
    req.post("a")
    req.post("b")
    assert handed == []  # nothing leaves before the flush
    req.send("error")
    assert handed == [("a", "b"), "error"]
    req.flush()  # nothing left: no empty hand-over
    assert handed == [("a", "b"), "error"]


def test_a_steps_streams_on_one_event_loop_wake_it_once():
    loop, other = Loop(), Loop()
    handed: list[list] = [[], [], []]
    reqs = [
        handed_over(loop, handed[0]),
        handed_over(loop, handed[1]),
        handed_over(other, handed[2]),
    ]
    for i, req in enumerate(reqs):
        req.post(f"t{i}")
    reqs[1].post("u1")
    hand_over(reqs)
    assert handed == [[("t0",)], [("t1", "u1")], [("t2",)]]
    assert (loop.wake_ups, other.wake_ups) == (1, 1)
    hand_over(reqs)  # nothing posted since: no wake-up
    assert (loop.wake_ups, other.wake_ups) == (1, 1)


def test_a_request_whose_event_loop_is_gone_is_closed():
    handed: list = []
    gone, live = handed_over(Loop(closed=True), handed), handed_over(Loop(), handed)
    gone.post("a")
    live.post("b")
    hand_over([gone, live])
    assert gone.closed and not live.closed
    assert handed == [("b",)]


def test_without_a_handoff_each_event_is_emitted_in_order():
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


def test_a_stream_hands_over_at_most_once_per_interval():
    loop = Loop()
    handed: list = []
    req = handed_over(loop, handed)
    req.post(token("a", (1,)))
    assert hand_over_due([req], 60.0) == []  # the first leaves at once
    req.post(token("b", (2,)))
    assert hand_over_due([req], 60.0) == [req]  # within the interval: kept
    req.post(token("c", (3,)))
    assert hand_over_due([req], 60.0) == [req]
    assert handed == [(token("a", (1,)),)] and loop.wake_ups == 1
    req.handed_at = time.monotonic() - 61  # the interval has passed
    assert hand_over_due([req], 60.0) == []
    assert handed[-1] == (token("bc", (2, 3)),)  # what waited, joined: one chunk
    assert loop.wake_ups == 2


def test_a_zero_interval_hands_every_step_over():
    loop = Loop()
    handed: list = []
    req = handed_over(loop, handed)
    for i in range(3):
        req.post(token(str(i), (i,)))
        assert hand_over_due([req], 0.0) == []
    assert handed == [(token(str(i), (i,)),) for i in range(3)]


def test_a_flush_sends_what_the_interval_kept():
    handed: list = []
    req = handed_over(Loop(), handed)
    req.post(token("a", (1,)))
    hand_over_due([req], 60.0)
    req.post(token("b", (2,)))
    assert hand_over_due([req], 60.0) == [req]
    req.send("finish")  # a sequence's end leaves at once, after what it had posted
    assert handed == [(token("a", (1,)),), (token("b", (2,)),), "finish"]
