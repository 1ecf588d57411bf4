"""The prefix cache: a free slot keeps the KV its last sequence wrote, and a prompt that
begins with those tokens resumes after them (reported as cached_tokens) with the same
answer as computed cold; the bounds hand kept slots back."""

from __future__ import annotations

import dataclasses

import pytest

from engine.serving import slot_cache
from engine.serving.slot_cache import SlotContents, Spilled, common_prefix
from engine.types import FinishEvent, GenerationRequest, SamplingParams
from tests.support import generate_text

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def svc(smollm2_service):
    """The session's SmolLM2 weights served with the prefix cache on (the suite's own
    service runs without it)."""
    config = dataclasses.replace(smollm2_service.config, name="prefix", prefix_cache=True)
    sibling = smollm2_service.sibling(config)
    yield sibling
    sibling.close()


@pytest.fixture(autouse=True)
def cold(request):
    if "svc" in request.fixturenames:
        forget(request.getfixturevalue("svc"))


def forget(svc) -> None:
    """Drop what the slots keep: the next prompt runs cold."""
    svc.clear_prefix_cache().result(timeout=30)


def run(svc, prompt, namespace="") -> tuple[str, FinishEvent]:
    request = GenerationRequest("pc", tuple(prompt), GREEDY, cache_namespace=namespace)
    return generate_text(svc, request)


def test_the_same_prompt_again_resumes_from_the_slot_and_answers_the_same(svc):
    prompt = svc.encode_chat([{"role": "user", "content": "Name a large animal."}])
    cold, first = run(svc, prompt)
    assert first.usage.cached_tokens == 0
    warm, again = run(svc, prompt)
    assert again.usage.cached_tokens == len(prompt) - 1  # the last token gives the logits
    assert warm == cold


def test_a_prompt_sharing_the_template_reuses_only_the_shared_tokens(svc):
    a = svc.encode_chat([{"role": "user", "content": "Describe the sea."}])
    b = svc.encode_chat([{"role": "user", "content": "Describe a mountain."}])
    shared = common_prefix(tuple(a), tuple(b))
    assert 0 < shared < len(b) - 1
    run(svc, a)
    warm, finish = run(svc, b)
    assert finish.usage.cached_tokens == shared
    forget(svc)
    cold, finish = run(svc, b)
    assert finish.usage.cached_tokens == 0
    assert warm == cold


def test_a_continued_conversation_reuses_the_answer_s_tokens_too(svc):
    """Turn 2 of a chat sent without a session id: the slot holds turn 1's prompt and the
    answer's tokens, and the new prompt begins with them (as far as the template agrees)."""
    first = [{"role": "user", "content": "Say hello."}]
    prompt = svc.encode_chat(first)
    answer, _ = run(svc, prompt)
    follow = svc.encode_chat(
        [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "Again."}]
    )
    _, finish = run(svc, follow)
    assert finish.usage.cached_tokens > len(prompt)


def test_one_key_never_reuses_what_another_key_left(svc):
    """The cache is partitioned by the caller's namespace: cached_tokens (and the time
    saved) would tell key B that key A sent the same prompt."""
    prompt = svc.encode_chat([{"role": "user", "content": "A secret question."}])
    run(svc, prompt, namespace="key-a")
    assert run(svc, prompt, namespace="key-b")[1].usage.cached_tokens == 0
    assert run(svc, prompt, namespace="key-a")[1].usage.cached_tokens == len(prompt) - 1


def test_admission_prefers_the_slot_with_the_longest_shared_beginning():
    contents = SlotContents(max_positions=1000, max_parked=1)
    contents.ended(0, (1, 2, 3, 4), now=0.0)
    contents.ended(1, (1, 2, 9), now=0.0)
    assert contents.freed([0, 1], now=0.0) == []
    assert contents.reusable(0, (1, 2, 3), namespace="other") == 0
    assert contents.prefer((1, 2, 9, 9), [0, 1, 2]) == 1
    assert contents.prefer((1, 2, 3, 4, 5), [0, 1, 2]) == 0
    assert contents.reusable(0, (1, 2, 3, 4, 5)) == 4
    # Nothing shared: an empty slot, so that kept prefixes survive; none: the oldest kept.
    assert contents.prefer((7,), [0, 1, 2]) == 2
    contents.ended(1, (1, 2, 9), now=5.0)
    contents.freed([1], now=5.0)
    assert contents.prefer((7,), [0, 1]) == 0
    contents.taken([0])
    assert contents.reusable(0, (1, 2, 3)) == 0


def test_a_shared_beginning_is_copied_rather_than_a_longer_conversation_overwritten():
    contents = SlotContents(max_positions=1000, max_parked=1)
    contents.ended(0, (1, 2, 3, 4, 5), now=0.0)  # someone's conversation
    contents.ended(1, (8, 8), now=1.0)
    contents.freed([0, 1], now=1.0)
    # Shares (1, 2) with slot 0, which holds more: the empty slot 2 gets a copy of them.
    assert contents.prefer((1, 2, 7), [0, 1, 2]) == 2
    assert contents.copies_from(0) == 2  # slot 0's first 2 positions are still to be read
    assert contents.copy_source(2) == (0, 2)
    assert contents.copies_from(0) == 0
    assert contents.copy_source(2) is None  # once
    # No empty slot: the least recently kept other one (1) takes the copy.
    assert contents.prefer((1, 2, 7), [0, 1]) == 1
    assert contents.copy_source(1) == (0, 2)
    # A prompt continuing all that slot 0 holds resumes in it, nothing copied.
    assert contents.prefer((1, 2, 3, 4, 5, 6), [0, 1, 2]) == 0
    assert contents.copy_source(0) is None
    # Taking a slot drops a copy planned for it that never ran (its group went away).
    contents.prefer((1, 2, 7), [0, 1, 2])
    contents.taken([2])
    assert contents.copy_source(2) is None
    # Without sharing (PANTHEON_PREFIX_CACHE=0) nothing is copied.
    private = SlotContents(max_positions=1000, max_parked=1, share=False)
    private.ended(0, (1, 2, 3, 4, 5), now=0.0)
    private.freed([0], now=0.0)
    assert private.prefer((1, 2, 7), [0, 1]) == 1 and private.copy_source(1) is None


def test_a_copied_prefix_answers_as_cold_and_leaves_the_longer_conversation(svc):
    system = {"role": "system", "content": "You are a terse geography tutor."}
    first = [system, {"role": "user", "content": "Name a river in France."}]
    prompt = svc.encode_chat(first)
    answer, _ = run(svc, prompt)
    other = svc.encode_chat([system, {"role": "user", "content": "Name a lake in Italy."}])
    shared = common_prefix(tuple(prompt), tuple(other))
    warm, finish = run(svc, other)
    assert finish.usage.cached_tokens == shared  # copied from the first conversation's slot
    follow = svc.encode_chat(
        [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "More?"}]
    )
    _, finish = run(svc, follow)
    assert finish.usage.cached_tokens > len(prompt)  # its slot was not overwritten
    forget(svc)
    assert run(svc, other)[0] == warm


def test_kept_slots_are_handed_back_past_the_bounds():
    contents = SlotContents(max_positions=6, max_parked=1)
    contents.ended(0, (1, 2, 3), now=0.0)
    contents.ended(1, (4, 5, 6), now=1.0)
    assert contents.freed([0, 1], now=1.0) == []
    contents.ended(2, (7, 8), now=2.0)
    assert contents.freed([2], now=2.0) == [0]  # 8 positions > 6: the oldest goes
    assert sorted(contents.freed([], now=2.0 + slot_cache.KEEP_S + 1)) == [1, 2]  # unused
    assert len(contents) == 0
    # A slot whose sequence ended with nothing to keep (or was never noted) is released.
    assert contents.freed([3], now=0.0) == [3]


class _Conv:  # a parked conversation stands for itself (weakly referenced)
    moved_out = False

    def move_out(self):  # its KV leaves the slot (conversation.py)
        self.moved_out = True


def test_only_a_quarter_of_the_slots_keep_parked_conversations():
    convs = [_Conv(), _Conv()]
    contents = SlotContents(max_positions=1000, max_parked=1)
    contents.ended(0, (1,), now=0.0, parked=convs[0])
    contents.ended(1, (2,), now=1.0, parked=convs[1])
    assert contents.freed([0, 1], now=1.0) == [0]
    assert convs[0].moved_out and not convs[1].moved_out  # out of slot 0 before its release
    assert contents.parked_conversation(1) is convs[1]
    assert contents.reusable(1, (2, 3)) == 1
    del convs[1]  # the session released: its copy in the slot goes too
    assert contents.reusable(1, (2, 3)) == 0
    assert contents.freed([], now=1.0) == [1]


def test_a_session_turn_continues_its_own_parked_conversation_in_its_slot():
    """Turn 2 shares turn 1's prompt but not its answer's tokens (the template renders the
    answer its own way): the turn takes the conversation's slot and overwrites the short
    tail, rather than copying the long shared part into another slot. Another session's
    conversation, or a tail longer than the shared part, is still copied from."""
    history = tuple(range(100, 300))  # turn 1's prompt
    conv = _Conv()
    contents = SlotContents(max_positions=1000, max_parked=4)
    contents.ended(2, (*history, 7, 8, 9), now=0.0, namespace="k", parked=conv, session="s1")
    contents.freed([2], now=0.0)
    turn2 = (*history, 5, 6, 11)
    assert contents.prefer(turn2, [0, 1, 2], namespace="k", session="s1") == 2
    assert contents.copy_source(2) is None and not conv.moved_out
    # Another session with the same history: the shared part is copied, the slot stays.
    assert contents.prefer(turn2, [0, 1, 2], namespace="k", session="s2") == 0
    assert contents.copy_source(0) == (2, len(history))
    assert contents.prefer(turn2, [0, 1, 2], namespace="k") == 0  # no session: the same
    contents.copy_source(0)
    # Its own, but the tail it would overwrite is longer than what it keeps: copied.
    short = (*history[:50], 1)
    assert contents.prefer(short, [0, 1, 2], namespace="k", session="s1") == 0
    assert contents.copy_source(0) == (2, 50)


# --- host memory behind the slots (spilled prefixes) ------------------------------------


class _Arr:  # stands for a saved KV array: only its size matters to the store
    def __init__(self, nbytes):
        self.nbytes = nbytes


def _spill(contents, slot, now=0.0, nbytes=100):
    """What the service does at admission: save what a chosen slot held, if asked."""
    entry = contents.spill_source(slot)
    if entry is not None:
        entry.k, entry.v = _Arr(nbytes), _Arr(nbytes)
        contents.spilled(entry, now)
        return entry.tokens, entry.namespace
    return None


def _store(contents, tokens, namespace="", nbytes=100, now=0.0):
    contents.spilled(Spilled(tuple(tokens), namespace, _Arr(nbytes), _Arr(nbytes), now), now)


def test_an_overwritten_slot_goes_to_host_memory_and_comes_back_for_its_prompt():
    long_a, long_b = tuple(range(100, 140)), tuple(range(200, 240))
    contents = SlotContents(max_positions=1000, max_parked=1, max_spill_bytes=10_000)
    contents.ended(0, long_a, now=0.0, namespace="k")
    contents.freed([0], now=0.0)
    # One free slot, an unrelated prompt: slot 0's conversation is copied out first.
    assert contents.prefer(long_b, [0], namespace="k") == 0
    assert _spill(contents, 0) == (long_a, "k")
    contents.taken([0])
    assert contents.spilled_bytes() == 200
    contents.ended(0, long_b, now=1.0, namespace="k")
    contents.freed([0], now=1.0)
    # long_a again: no slot holds it, host memory does; loaded into the slot, which spills
    # long_b in turn.
    prompt = (*long_a, 7, 8)
    assert contents.prefer(prompt, [0], namespace="k") == 0
    entry, n = contents.restore_source(0)
    assert entry.tokens == long_a and n == len(long_a)
    assert contents.restore_source(0) is None  # once
    assert _spill(contents, 0)[0] == long_b
    # Another key never gets it.
    _store(contents, long_a, "k", now=2.0)
    assert contents.prefer(prompt, [1], namespace="other") == 1
    assert contents.restore_source(1) is None


def test_room_for_a_spill_is_made_before_its_copy():
    """The oldest entries go before the copy (its memory can reuse theirs: host_buffers),
    exactly those that storing it would have pushed out, and none for an entry that will
    not be stored."""
    contents = SlotContents(max_positions=1000, max_parked=1, max_spill_bytes=1_000)
    for i in range(3):
        _store(contents, range(i * 100, i * 100 + 20), nbytes=150, now=i)  # 3 x 300 bytes
    contents.ended(0, tuple(range(500, 540)), now=4.0)
    contents.freed([0], now=4.0)
    assert contents.prefer((9,) * 30, [0]) == 0
    entry = contents.spill_source(0)
    contents.make_spill_room(entry, 400)
    assert contents.spilled_bytes() == 600  # the oldest went: 600 + 400 fits
    entry.k, entry.v = _Arr(200), _Arr(200)
    contents.spilled(entry, now=5.0)
    assert contents.spilled_bytes() == 1_000  # nothing more went after the copy
    contents.make_spill_room(Spilled((5,) * 20, "", None, None, 6.0), 2_000)  # never stored
    claimed = Spilled((6,) * 20, "", None, None, 6.0, claimed=True)
    contents.make_spill_room(claimed, 500)  # goes back into a slot, not into the store
    assert contents.spilled_bytes() == 1_000


def test_host_memory_is_bounded_and_skips_what_is_not_worth_it():
    contents = SlotContents(max_positions=1000, max_parked=4, max_spill_bytes=1_000)
    for i in range(4):  # 4 x 400 bytes into 1000: the two least recent go
        _store(contents, range(i * 100, i * 100 + 20), nbytes=200, now=i)
    assert contents.spilled_bytes() == 800
    assert contents.prefer(tuple(range(0, 20)), [0]) == 0 and contents.restore_source(0) is None
    assert contents.prefer(tuple(range(300, 320)), [0]) == 0
    assert contents.restore_source(0)[1] == 20
    _store(contents, (1,) * 20, nbytes=600, now=5.0)  # bigger than it all
    assert contents.spilled_bytes() == 400
    # Neither a session's parked conversation (it has its own copy) nor a short prefix.
    conv = _Conv()
    contents.ended(0, tuple(range(500, 540)), now=6.0, parked=conv)
    contents.ended(1, (1, 2, 3), now=6.0)
    contents.freed([0, 1], now=6.0)
    assert contents.prefer((9,) * 30, [0]) == 0 and contents.spill_source(0) is None
    assert contents.prefer((9,) * 30, [1]) == 1 and contents.spill_source(1) is None
    # Dropped after SPILL_KEEP_S, and by clear() (the memory ladder, the admin route).
    contents.freed([], now=6.0 + slot_cache.SPILL_KEEP_S + 1)
    assert contents.spilled_bytes() == 0
    _store(contents, range(20), nbytes=10)
    contents.clear()
    assert contents.spilled_bytes() == 0
    # Without sharing (PANTHEON_PREFIX_CACHE=0) nothing goes to host memory.
    private = SlotContents(max_positions=1000, max_parked=1, share=False, max_spill_bytes=1_000)
    private.ended(0, tuple(range(40)), now=0.0)
    private.freed([0], now=0.0)
    assert private.prefer((5,) * 30, [0]) == 0 and private.spill_source(0) is None


def test_a_copy_displaced_in_the_same_admission_is_loaded_for_the_prompt_that_wants_it():
    """Two prompts arrive together: the first is restored into the slot that held the
    second's conversation, whose copy (saved before the restore overwrites it) then goes
    to the second's slot."""
    a, b = tuple(range(100, 140)), tuple(range(200, 240))
    contents = SlotContents(max_positions=1000, max_parked=1, max_spill_bytes=10_000)
    _store(contents, a)
    contents.ended(0, b, now=1.0)
    contents.ended(1, (7,) * 20, now=0.5)
    contents.freed([0, 1], now=1.0)
    assert contents.prefer((*a, 1), [0]) == 0  # a into slot 0, displacing b (pending)
    assert contents.prefer((*b, 1), [1]) == 1  # b finds its pending copy
    # The service, in admission order: slot 0 first (save b, load a), then slot 1.
    assert _spill(contents, 0) == (b, "")
    assert contents.restore_source(0)[0].tokens == a
    contents.taken([0])
    assert contents.spill_source(1).tokens == (7,) * 20
    entry, n = contents.restore_source(1)
    assert entry.tokens == b and n == len(b) and entry.k is not None
    assert contents.spilled_bytes() == 0  # a and b are in slots again, not stored twice
    # When the group that displaced b goes away before saving it, b's prompt runs cold.
    contents.ended(0, b, now=2.0)
    contents.freed([0], now=2.0)
    _store(contents, a)
    contents.prefer((*a, 1), [0])
    contents.prefer((*b, 1), [1])
    contents.taken([0])  # cancelled: nothing saved
    assert contents.restore_source(1) is None


def test_more_conversations_than_slots_resume_from_host_memory_and_answer_the_same(svc):
    n_slots = svc.max_concurrent_configured
    prompts = [
        svc.encode_chat([{"role": "user", "content": f"Tell me one fact about the number {i}."}])
        for i in range(n_slots + 1)
    ]
    first_answer, first = run(svc, prompts[0])
    assert first.usage.cached_tokens == 0
    for prompt in prompts[1:]:  # the last of these takes the first prompt's slot
        run(svc, prompt)
    assert svc.slot_contents.spilled_bytes() > 0
    again, finish = run(svc, prompts[0])
    assert finish.usage.cached_tokens == len(prompts[0]) - 1  # loaded back, not recomputed
    assert again == first_answer
    forget(svc)
    assert svc.slot_contents.spilled_bytes() == 0


def test_a_kept_slot_holds_no_pages_past_what_it_keeps(svc):
    """A short prompt that takes the slot of a long one's kept KV: once it ends, the long
    one's later positions are handed back (they were resident and read by no one)."""
    n_slots = svc.max_concurrent_configured
    long_prompt = svc.encode_chat([{"role": "user", "content": "lighthouse keeper " * 150}])
    run(svc, long_prompt)
    for i in range(n_slots):  # the last of these takes the long prompt's slot
        run(svc, svc.encode_chat([{"role": "user", "content": f"Count to {i}."}]))

    def look():  # on the engine thread, after it has handled the last freed slot
        kept = {slot: svc.slot_contents.kept_positions(slot) for slot in range(n_slots)}
        return kept, {slot: svc.kv._high_water[slot] for slot in range(n_slots)}
        yield

    kept, written = svc.submit(look()).result(timeout=30)
    assert all(kept.values())
    assert written == kept
    assert max(written.values()) < len(long_prompt)
