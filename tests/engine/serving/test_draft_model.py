"""Speculation with a draft model (serving/draft_model.py) on the real SmolLM2: with the
draft model drafting, every request gets the tokens of speculation off (greedy, seeded,
json_schema, n = 2, a session's second turn); SmolLM2 drafting for itself (the same GGUF
loaded twice) is almost always right; a tiny random draft with SmolLM2's vocabulary is
used and does not change a token; a draft of another vocabulary is refused."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from engine.chat.core import prepare_turn
from engine.chat.turn import Turn
from engine.serving.draft_model import DraftSlots, load_draft
from engine.serving.service import ModelService
from engine.types import IncompatibleDraftModel, ModelConfig, TokenEvent
from tests.engine.serving.test_speculation import CASES, GREEDY, REPEAT, run, same, user
from tests.tiny_gguf import write_tiny_llama

SEA = Turn(user("Write two sentences about the sea."), sampling=replace(GREEDY, max_tokens=48))


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory, smollm2_path):
    """A 2-layer random llama with SmolLM2's tokenizer."""
    folder = tmp_path_factory.mktemp("draft")
    return write_tiny_llama(folder / "tiny-smol.gguf", vocab_from=smollm2_path, seed=1)


@pytest.fixture(scope="module")
def self_drafted(smollm2_service):
    """SmolLM2 with SmolLM2 (its file loaded a second time) as its draft model."""
    path = smollm2_service.path
    config = ModelConfig(name="self-draft", path=path, max_concurrent=2, draft_model=path)
    svc = smollm2_service.sibling(config)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def tiny_drafted(smollm2_service, tiny_draft):
    config = ModelConfig(
        name="tiny-draft", path=smollm2_service.path, max_concurrent=2, draft_model=str(tiny_draft)
    )
    svc = smollm2_service.sibling(config)
    yield svc
    svc.close()


def model_counts(svc) -> tuple[int, int]:
    return svc.stats.model_drafted_tokens, svc.stats.model_accepted_tokens


@pytest.mark.parametrize("case", ["chat-greedy", "chat-seeded", "json-schema"])
def test_the_same_tokens_with_the_draft_model(self_drafted, tiny_drafted, case):
    turn = CASES[case]
    off = run(self_drafted, replace(turn, speculation="off"))
    for svc in (self_drafted, tiny_drafted):
        before = model_counts(svc)
        same(off, run(svc, turn))
        assert model_counts(svc)[0] > before[0], case  # the draft model did draft


def test_a_model_drafting_for_itself_is_almost_always_right(self_drafted):
    before = model_counts(self_drafted)
    off = run(self_drafted, replace(SEA, speculation="off"))
    assert model_counts(self_drafted) == before  # off: not a single draft
    same(off, run(self_drafted, SEA))
    drafted = model_counts(self_drafted)[0] - before[0]
    accepted = model_counts(self_drafted)[1] - before[1]
    assert drafted >= 10, (drafted, accepted)
    assert accepted >= 0.9 * drafted, (drafted, accepted)


def test_a_tiny_random_draft_is_used_and_changes_nothing(tiny_drafted):
    before = model_counts(tiny_drafted)
    off = run(tiny_drafted, replace(SEA, speculation="off"))
    same(off, run(tiny_drafted, SEA))
    assert model_counts(tiny_drafted)[0] > before[0]


def test_n_two_decodes_without_drafts(self_drafted):
    async def choices(speculation):
        turn = replace(CASES["chat-seeded"], n=2, speculation=speculation)
        ids: dict[int, list[int]] = {}
        async for ev in self_drafted.generate(prepare_turn(self_drafted, turn).request):
            if isinstance(ev, TokenEvent):
                ids.setdefault(ev.index, []).extend(ev.token_ids)
        return ids

    off = asyncio.run(choices("off"))
    before = self_drafted.stats.drafted_tokens
    assert asyncio.run(choices("auto")) == off
    assert self_drafted.stats.drafted_tokens == before


def test_a_session_turn_two_is_the_same(self_drafted):
    def turns(session: str, speculation: str):
        first = run(self_drafted, replace(SEA, session_id=session, speculation=speculation))
        again = Turn(
            (*SEA.messages, {"role": "assistant", "content": first[2]}, *user(REPEAT)),
            sampling=GREEDY,
            session_id=session,
            speculation=speculation,
        )
        return first, run(self_drafted, again)

    off = turns("draft-off", "off")
    before = model_counts(self_drafted)
    auto = turns("draft-auto", "auto")
    same(off[0], auto[0])
    same(off[1], auto[1])
    assert auto[1][3].usage.cached_tokens > 0  # turn 2 resumed from the session
    assert model_counts(self_drafted)[0] > before[0]


def test_the_draft_cache_rolls_back_to_the_accepted_tokens(smollm2_service, tiny_draft):
    draft = load_draft(
        ModelConfig(name="t", path=smollm2_service.path, draft_model=str(tiny_draft)),
        smollm2_service.gguf,
    )
    tokenizer = smollm2_service.tokenizer
    slots = DraftSlots(draft, 2, 512, tokenizer.vocab_size, ())
    context = tokenizer.encode("The sea is calm and the sky is blue today")
    first = slots.propose(1, context, 3)
    assert len(first) == 3
    assert slots._held[1] == [*context, *first[:2]]  # the last draft token is never fed
    # one draft token accepted, then another token: the rejected ones are dropped
    later = [*context, first[0], (first[1] + 1) % tokenizer.vocab_size]
    assert len(slots.propose(1, later, 2)) == 2
    assert slots._held[1][: len(later)] == later
    # another sequence in the slot: it catches up from the common prefix
    other = tokenizer.encode("The sea is cold")
    assert len(slots.propose(1, other, 1)) == 1
    assert slots._held[1] == other
    assert slots._held[0] == []  # the other slot untouched


def test_a_draft_of_another_vocabulary_is_refused(smollm2_service, tmp_path):
    byte_level = write_tiny_llama(tmp_path / "bytes.gguf")
    config = ModelConfig(name="x", path=smollm2_service.path, draft_model=str(byte_level))
    with pytest.raises(IncompatibleDraftModel, match="vocabulary"):
        ModelService.load(config)
