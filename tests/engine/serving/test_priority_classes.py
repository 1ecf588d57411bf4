"""Priority classes in the scheduler's bookkeeping (fake token ids, no model): batch
groups never 429 and never time out, wait behind interactive ones, stay within their
share, and give their slots to an interactive group at the next step (parked, with the
KV positions they wrote, and unparked before any queued batch group)."""

from __future__ import annotations

from engine.serving.batch import Batch
from engine.serving.scheduler import Scheduler

BATCH = "batch"


def step(s: Scheduler, token: int = 7):
    started = s.admit()
    batch = s.plan(started)
    sampled = {seq: token for seq in batch.sampling_seq_ids()}
    s.update(batch, sampled)
    return started, batch


def test_batch_groups_are_never_refused_and_never_time_out():
    clock = [0.0]
    s = Scheduler(1, 64, queue_depth=0, queue_timeout_s=1.0, clock=lambda: clock[0])
    ids = [s.add((1, 2), max_tokens=5, priority=BATCH) for _ in range(50)]
    clock[0] = 100.0
    assert s.expire() == [] and s.queued == 50
    assert len(ids) == 50


def test_an_interactive_group_takes_a_batch_slot_at_the_next_step():
    s = Scheduler(2, 64, queue_depth=0)
    b1 = s.add((1, 2, 3), max_tokens=50, priority=BATCH)
    b2 = s.add((4, 5, 6), max_tokens=50, priority=BATCH)
    step(s)
    step(s)  # both decoding, every slot held
    assert s.running == 2
    live = s.add((9, 9), max_tokens=3)  # no 429 although the queue depth is 0
    started, batch = step(s)
    assert [g.group_id for g in started] == [live]
    moves = s.lane.pop_moves()
    assert len(moves.park) == 1 and not moves.unpark
    parked_seq, slot, positions = moves.park[0]
    assert slot == started[0].slots[0] and positions == 3 + 2 - 1
    assert parked_seq not in {row.seq_id for row in batch.decode}
    # The interactive group ends; the parked one comes back before anything queued.
    b3 = s.add((7, 7), max_tokens=5, priority=BATCH)
    for _ in range(3):
        step(s)
    moves = s.lane.pop_moves()
    assert [m[0] for m in moves.unpark] == [parked_seq]
    assert {b1, b2} <= set(s._running) and b3 not in s._running


def test_batch_work_stays_within_its_share_of_the_slots():
    s = Scheduler(4, 64, batch_share=0.5)
    for _ in range(4):
        s.add((1, 2), max_tokens=50, priority=BATCH)
    step(s)
    assert s.running == 2 and s.queued == 2
    s.add((3, 3), max_tokens=5)
    started, _ = step(s)
    assert len(started) == 1 and s.running == 3  # a free slot: nothing parked
    assert not s.lane.pop_moves()


def test_a_cancelled_parked_group_drops_its_kept_kv():
    s = Scheduler(1, 64)
    b = s.add((1, 2), max_tokens=50, priority=BATCH)
    step(s)
    s.add((3,), max_tokens=50)
    step(s)
    parked = s.lane.pop_moves().park[0][0]
    assert s.cancel(b)
    assert s.lane.pop_moves().drop == [parked]
    assert isinstance(s.plan(), Batch)
