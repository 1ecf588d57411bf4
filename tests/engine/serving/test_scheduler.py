"""The continuous-batching scheduler as pure bookkeeping: no model, fake token ids."""

from __future__ import annotations

import pytest

from engine.serving.batch import (
    FINISH_LENGTH,
    FINISH_STOP,
    REFUSED_MEMORY,
    REFUSED_QUEUE_TIMEOUT,
    Batch,
    Finished,
    QueueFull,
    Refused,
    Sampled,
)
from engine.serving.scheduler import Scheduler

EOT = 99  # the fake end-of-turn id


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(slots=2, window=64, chunk=4, depth=2, timeout=30.0, clock=None) -> Scheduler:
    return Scheduler(
        slots,
        window,
        prefill_chunk=chunk,
        queue_depth=depth,
        queue_timeout_s=timeout,
        end_ids={EOT},
        clock=clock or Clock(),
    )


def next_batch(s: Scheduler) -> Batch:
    """The engine loop's order with no cached prefix to resume: admit, then plan."""
    return s.plan(s.admit())


def step(s: Scheduler, token: int = 7, tokens: dict[int, int] | None = None):
    """next_batch() + update() with every sampled id = `token` (or per seq from `tokens`)."""
    batch = next_batch(s)
    sampled = {sid: (tokens or {}).get(sid, token) for sid in batch.sampling_seq_ids()}
    return batch, s.update(batch, sampled)


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


def test_admission_is_first_in_first_out_into_the_lowest_free_slots():
    s = make(slots=2, depth=5)
    a, b, c = (s.add((1, 2), max_tokens=5) for _ in range(3))
    batch = next_batch(s)
    assert [st.group_id for st in batch.started] == [a, b]  # c waits: two slots
    assert [chunk.slot for chunk in batch.prefill] == [0, 1]
    assert s.queued == 1 and s.in_flight == 3 and s.running == 2


def test_the_head_of_the_queue_is_never_overtaken():
    s = make(slots=3, depth=5)
    s.add((1,), max_tokens=9)
    next_batch(s)
    big = s.add((1,), n=3, max_tokens=1)  # needs all three slots
    small = s.add((1,), max_tokens=1)  # would fit now, but waits behind `big`
    batch = next_batch(s)
    assert batch.started == ()
    assert s.queued == 2
    assert big < small


def test_prefill_is_chunked_at_fixed_boundaries_and_interleaved_with_decode():
    s = make(slots=2, chunk=4)
    short = s.add((1, 2, 3), max_tokens=10)
    batch, events = step(s)
    assert [len(c.token_ids) for c in batch.prefill] == [3]  # the whole short prompt
    long = s.add(tuple(range(10)), max_tokens=10)  # 10 tokens: chunks 0-4, 4-8, 8-10

    starts = []
    for _ in range(3):
        batch, events = step(s)
        # Every step decodes the running stream while the long prompt prefills.
        assert [r.seq_id for r in batch.decode] == [1]
        starts += [(c.start, len(c.token_ids)) for c in batch.prefill]
    assert starts == [(0, 4), (4, 4), (8, 2)]
    # The last chunk samples the first token; the next step decodes both.
    assert {e.group_id for e in of(events, Sampled)} == {short, long}
    batch, _ = step(s)
    assert batch.prefill == () and len(batch.decode) == 2


def test_prefill_budget_runs_several_short_prompts_in_one_step_and_whole_chunks_only():
    s = make(slots=4, chunk=8, depth=5)
    for prompt in ((1, 2, 3), (4, 5, 6), (7,) * 12):
        s.add(prompt, max_tokens=3)
    batch = next_batch(s)
    # 3 + 3 tokens, then the 12-token prompt's first chunk (8) would overflow the budget.
    assert [len(c.token_ids) for c in batch.prefill] == [3, 3]
    s.update(batch, {sid: 1 for sid in batch.sampling_seq_ids()})
    batch = next_batch(s)
    assert [(c.start, len(c.token_ids)) for c in batch.prefill] == [(0, 8)]


def test_decode_rows_carry_positions_and_the_last_sampled_token():
    s = make(slots=1, chunk=16)
    s.add((5, 6, 7), max_tokens=10)
    step(s, token=40)
    batch, _ = step(s, token=41)
    (row,) = batch.decode
    assert (row.position, row.token_id) == (3, 40)
    batch, _ = step(s)
    assert (batch.decode[0].position, batch.decode[0].token_id) == (4, 41)


def test_end_of_turn_finishes_with_stop_and_is_not_counted():
    s = make(slots=1)
    s.add((1, 2), max_tokens=10)
    step(s, token=5)
    _, events = step(s, token=EOT)
    (fin,) = of(events, Finished)
    assert fin.reason == FINISH_STOP and fin.completion_tokens == 1
    assert fin.prompt_tokens == 2 and fin.kv_used == 3 and fin.group_done
    assert not of(events, Sampled)
    assert s.in_flight == 0


def test_max_tokens_finishes_with_length_on_the_last_token():
    s = make(slots=1)
    s.add((1, 2), max_tokens=2)
    step(s)
    _, events = step(s)
    assert [type(e) for e in events] == [Sampled, Finished]
    assert events[1].reason == FINISH_LENGTH and events[1].completion_tokens == 2


def test_a_full_window_finishes_with_length():
    s = make(slots=1, window=6, chunk=8)
    s.add((1, 2, 3, 4), max_tokens=100)
    n_tokens = 0
    while s.in_flight:
        _, events = step(s)
        n_tokens += len(of(events, Sampled))
    # Positions 4 and 5 take the first two tokens' KV; the third has no room left.
    assert n_tokens == 3
    assert of(events, Finished)[0].kv_used == 6


def test_a_finished_slot_is_reused_by_the_next_request_at_once():
    s = make(slots=1, depth=3)
    first = s.add((1,), max_tokens=1)
    second = s.add((2,), max_tokens=1)
    batch, events = step(s)
    assert [st.group_id for st in batch.started] == [first]
    assert of(events, Finished)[0].group_done
    batch = next_batch(s)
    assert [st.group_id for st in batch.started] == [second]
    assert batch.prefill[0].slot == 0
    assert s.pop_freed_slots() == []  # slot 0 is taken again: its KV must not be dropped


def test_freed_slots_are_reported_while_still_free():
    s = make(slots=2)
    s.add((1,), max_tokens=1)
    step(s)
    assert s.pop_freed_slots() == [0]
    assert s.pop_freed_slots() == []


def test_a_full_queue_refuses_at_once():
    s = make(slots=1, depth=1)
    s.add((1,), max_tokens=5)
    next_batch(s)
    s.add((1,), max_tokens=5)  # waits
    with pytest.raises(QueueFull):
        s.add((1,), max_tokens=5)
    assert s.in_flight == 2


def test_with_depth_zero_only_free_slots_admit():
    s = make(slots=2, depth=0)
    s.add((1,), max_tokens=5)
    s.add((1,), max_tokens=5)  # free slots: accepted before any admit()
    with pytest.raises(QueueFull):
        s.add((1,), max_tokens=5)


def test_a_request_waiting_past_the_timeout_is_refused():
    clock = Clock()
    s = make(slots=1, depth=2, timeout=30, clock=clock)
    s.add((1,), max_tokens=1000)
    next_batch(s)
    waiting = s.add((1,), max_tokens=5)
    clock.now = 29.9
    assert s.expire() == []
    clock.now = 30.0
    (refused,) = s.expire()
    assert refused.group_id == waiting and refused.reason == REFUSED_QUEUE_TIMEOUT
    assert s.queued == 0 and s.in_flight == 1


def test_cancelling_a_queued_request_frees_its_place():
    s = make(slots=1, depth=1)
    s.add((1,), max_tokens=5)
    next_batch(s)
    queued = s.add((1,), max_tokens=5)
    with pytest.raises(QueueFull):
        s.add((1,), max_tokens=5)
    assert s.cancel(queued)
    s.add((1,), max_tokens=5)  # the place is free again
    assert s.queued == 1


def test_cancelling_a_running_request_frees_its_slot_and_ignores_its_in_flight_batch():
    s = make(slots=1, depth=1)
    gone = s.add((1, 2), max_tokens=50)
    step(s)
    nxt = s.add((3,), max_tokens=5)
    batch = next_batch(s)  # the running sequence's decode row is in this batch
    assert len(batch.decode) == 1
    assert s.cancel(gone)
    events = s.update(batch, {sid: 5 for sid in batch.sampling_seq_ids()})
    assert events == []  # nothing for a cancelled sequence
    batch = next_batch(s)
    assert [st.group_id for st in batch.started] == [nxt] and batch.prefill[0].slot == 0
    assert not s.cancel(gone)


def test_n_choices_share_one_prefill_and_sample_separately():
    s = make(slots=4, chunk=4, depth=2)
    g = s.add((1, 2, 3, 4, 5, 6), n=3, max_tokens=5)
    batch = next_batch(s)
    (started,) = batch.started
    assert started.group_id == g and len(started.seq_ids) == 3
    (chunk,) = batch.prefill
    assert chunk.copy_to_slots == () and chunk.sample_seq_ids == ()  # not the last chunk
    s.update(batch, {})
    batch = next_batch(s)
    (chunk,) = batch.prefill
    assert chunk.slot == 0 and chunk.copy_to_slots == (1, 2)
    assert chunk.sample_seq_ids == started.seq_ids
    first = dict(zip(started.seq_ids, (10, 11, EOT), strict=True))
    events = s.update(batch, first)
    assert [(e.index, e.token_id) for e in of(events, Sampled)] == [(0, 10), (1, 11)]
    (fin,) = of(events, Finished)
    assert fin.index == 2 and fin.choices == 3 and not fin.group_done
    batch = next_batch(s)
    assert [(r.slot, r.token_id) for r in batch.decode] == [(0, 10), (1, 11)]
    assert s.running == 2 and s.pop_freed_slots() == [2]


def run_out(s: Scheduler, tokens=None) -> list[object]:
    """Steps until nothing is in flight; every event, in order."""
    events: list[object] = []
    for _ in range(200):
        if not s.in_flight:
            return events
        assert s.running <= s.served_slots or s.queued == 0
        events += step(s, tokens=tokens)[1]
    raise AssertionError("still in flight after 200 steps")


def test_choices_beyond_the_served_slots_wait_and_take_their_group_s_slots_as_they_free():
    s = make(slots=2, chunk=4)
    g = s.add((1, 2, 3), n=5, max_tokens=3)
    batch = next_batch(s)
    (started,) = batch.started
    assert len(started.seq_ids) == 5 and started.slots == (0, 1)
    (chunk,) = batch.prefill
    # The prompt's KV goes to the one other slot; all five choices sample a first token.
    assert chunk.copy_to_slots == (1,) and chunk.sample_seq_ids == started.seq_ids
    first = {sid: 10 + i for i, sid in enumerate(started.seq_ids)}
    events = s.update(batch, first)
    assert [(e.index, e.token_id) for e in of(events, Sampled)] == [(i, 10 + i) for i in range(5)]
    assert s.running == 2

    seq0, seq1, seq2 = started.seq_ids[:3]
    batch, events = step(s, tokens={seq0: EOT, seq1: 7})
    assert [(r.slot, r.position, r.token_id) for r in batch.decode] == [(0, 3, 10), (1, 3, 11)]
    (fin,) = of(events, Finished)
    assert (fin.index, fin.slot, fin.choices, fin.group_done) == (0, 0, 5, False)
    # Slot 0 went straight to choice 2: it decodes its held first token after the prompt.
    batch = next_batch(s)
    assert [(r.seq_id, r.slot, r.position, r.token_id) for r in batch.decode] == [
        (seq1, 1, 4, 7),
        (seq2, 0, 3, 12),
    ]
    assert s.pop_freed_slots() == []  # never free: its prompt KV is kept
    s.update(batch, {})

    finished = of(run_out(s), Finished)
    assert sorted(f.index for f in [fin, *finished]) == [0, 1, 2, 3, 4]
    assert {f.choices for f in finished} == {5} and {f.group_id for f in finished} == {g}
    assert [f.group_done for f in finished] == [False] * 3 + [True]
    assert s.running == 0 and s.in_flight == 0


def test_with_one_token_each_every_choice_ends_at_the_prefill():
    s = make(slots=2)
    s.add((1,), n=5, max_tokens=1)
    batch, events = step(s)
    finished = of(events, Finished)
    assert [f.index for f in finished] == [0, 1, 2, 3, 4]
    assert {f.choices for f in finished} == {5} and finished[-1].group_done
    assert s.in_flight == 0 and s.pop_freed_slots() == [0, 1]


def test_a_group_keeps_only_the_slots_it_started_with_and_the_queue_behind_it_waits():
    s = make(slots=3, depth=2)
    a = s.add((1,), n=4, max_tokens=2)
    b = s.add((2,), max_tokens=2)
    batch = next_batch(s)
    assert [st.group_id for st in batch.started] == [a]  # b waits: a holds all three
    s.update(batch, {sid: 7 for sid in batch.sampling_seq_ids()})
    # The three running choices end together: one slot goes on to a's fourth choice,
    # the other two are free for b at the next step, while a still runs.
    _, events = step(s)
    assert len(of(events, Finished)) == 3 and s.running == 1
    batch = next_batch(s)
    assert [st.group_id for st in batch.started] == [b]
    assert s.running == 2


def test_under_a_lowered_slot_count_a_finished_choice_hands_on_only_its_group_s_last_slot():
    s = make(slots=2)
    s.add((1,), n=3, max_tokens=5)
    batch = next_batch(s)
    seq0, seq1, seq2 = batch.started[0].seq_ids
    s.update(batch, {sid: 7 for sid in batch.sampling_seq_ids()})
    s.set_limits(served_slots=1, context_window=64)
    _, events = step(s, tokens={seq0: EOT})
    assert of(events, Finished)[0].index == 0
    assert s.pop_freed_slots() == [0] and s.running == 1  # back to the served count
    _, events = step(s, tokens={seq1: EOT})
    assert of(events, Finished)[0].index == 1
    batch = next_batch(s)  # choice 2 runs in choice 1's slot
    assert [(r.seq_id, r.slot) for r in batch.decode] == [(seq2, 1)]
    s.update(batch, {})
    assert [f.index for f in of(run_out(s), Finished)] == [2]


def test_cancelling_a_group_with_waiting_choices_frees_everything():
    s = make(slots=2, depth=1)
    g = s.add((1,), n=4, max_tokens=9)
    batch = next_batch(s)
    s.update(batch, {sid: 7 for sid in batch.sampling_seq_ids()})
    batch = next_batch(s)
    assert s.cancel(g)
    assert s.update(batch, {sid: 7 for sid in batch.sampling_seq_ids()}) == []
    assert s.running == 0 and s.in_flight == 0
    assert s.pop_freed_slots() == [0, 1]


def test_a_group_s_waiting_choices_count_in_the_wait_for_a_slot():
    s = make(slots=1, chunk=4)
    s.add((1,), n=3, max_tokens=4)
    batch = next_batch(s)
    s.update(batch, {sid: 7 for sid in batch.sampling_seq_ids()})
    # Three tokens left for the running choice, then two more choices of four tokens.
    assert s.steps_until_a_slot_frees() == 3 + 2 * 4


def test_a_stop_string_finish_frees_the_slot():
    s = make(slots=1)
    s.add((1,), max_tokens=10)
    _, events = step(s)
    seq_id = of(events, Sampled)[0].seq_id
    fin = s.finish(seq_id)
    assert fin.reason == FINISH_STOP and fin.completion_tokens == 1 and fin.group_done
    assert s.finish(seq_id) is None
    assert s.in_flight == 0


def test_lower_limits_hold_new_work_and_clamp_the_window():
    s = make(slots=4, window=64, chunk=64, depth=5)
    a = s.add((1,) * 10, max_tokens=100)
    b = s.add((1,) * 40, max_tokens=100)
    for _ in range(15):
        step(s)
    waiting = s.add((1,) * 50, max_tokens=5)  # fits 64, not 48
    small = s.add((1,) * 4, max_tokens=5)
    events = s.set_limits(served_slots=1, context_window=48)
    # b is past the new window (40 + 15 tokens): it ends with length; a (10 + 15) goes on.
    fin = of(events, Finished)
    assert [f.group_id for f in fin] == [b] and fin[0].reason == FINISH_LENGTH
    assert fin[0].kv_cap == 48 and fin[0].kv_used == 48
    (refused,) = of(events, Refused)
    assert refused.group_id == waiting and refused.reason == REFUSED_MEMORY
    batch = next_batch(s)
    assert batch.started == ()  # one slot served, and a holds it
    assert [r.seq_id for r in batch.decode] == [1]
    s.set_limits(served_slots=4, context_window=64)
    batch = next_batch(s)
    assert [st.group_id for st in batch.started] == [small]
    assert a != small


def test_steps_until_a_slot_frees_bounds_the_wait():
    s = make(slots=1, chunk=4)
    assert s.steps_until_a_slot_frees() == 0
    s.add((1,) * 6, max_tokens=10)
    next_batch(s)
    # Two prefill chunks, then up to 10 tokens.
    assert s.steps_until_a_slot_frees() == 12


# --- resuming from a cached prefix (sessions) --------------------------------------------


def test_a_resumed_group_prefills_after_its_cached_tokens():
    s = make(chunk=4)
    g = s.add(tuple(range(1, 13)), max_tokens=3)  # 12 prompt tokens
    started = s.admit()
    assert started[0].slots == (0,)
    assert s.resume(g, 3)
    batch = s.plan(started)
    chunks = [(c.start, len(c.token_ids)) for c in batch.prefill]
    s.update(batch, {})
    for _ in range(2):
        batch, events = step(s, token=EOT)
        chunks += [(c.start, len(c.token_ids)) for c in batch.prefill]
    # Counted from the resumed position, whole chunks: 3..7, 7..11, then 11..12.
    assert chunks == [(3, 4), (7, 4), (11, 1)]
    [finished] = of(events, Finished)
    assert finished.cached_tokens == 3 and finished.prompt_tokens == 12


def test_resume_keeps_at_least_one_prompt_token_to_compute():
    s = make()
    g = s.add((1, 2, 3), max_tokens=2)
    started = s.admit()
    s.resume(g, 3)
    batch = s.plan(started)
    assert [(c.start, c.token_ids) for c in batch.prefill] == [(2, (3,))]


def test_resume_of_a_cancelled_group_is_refused():
    s = make()
    g = s.add((1, 2, 3), max_tokens=2)
    s.admit()
    s.cancel(g)
    assert s.resume(g, 2) is False


@pytest.mark.parametrize(
    ("last", "max_tokens", "reason", "written"),
    [
        (EOT, 5, FINISH_STOP, 3 + 2),  # ended on end-of-turn: both outputs were fed back
        (7, 3, FINISH_LENGTH, 3 + 2),  # cut at 3 outputs: the third never fed back
    ],
)
def test_finished_says_which_positions_hold_kv(last, max_tokens, reason, written):
    s = make()
    s.add((1, 2, 3), max_tokens=max_tokens)
    step(s, token=7)  # prefill + first output
    step(s, token=7)  # second output
    _, events = step(s, token=last)
    [finished] = of(events, Finished)
    assert finished.reason == reason
    assert finished.kv_written == written
    assert finished.slot == 0


def test_a_stop_string_finish_does_not_count_the_last_token_as_written():
    s = make()
    s.add((1, 2, 3), max_tokens=9)
    step(s, token=7)
    _, events = step(s, token=8)
    seq_id = of(events, Sampled)[0].seq_id
    finished = s.finish(seq_id)
    assert finished.kv_written == 3 + 1
