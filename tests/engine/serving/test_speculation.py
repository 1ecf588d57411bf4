"""Exact speculative decoding on the real SmolLM2: with speculation off, auto (prompt
lookup) and with a prediction (right or wrong), every request gets the same tokens, the
same logprobs and the same finish; the counters prove drafts were really accepted."""

from __future__ import annotations

import asyncio
import types
from dataclasses import replace

import pytest

from engine.chat.core import prepare_turn
from engine.chat.turn import Turn
from engine.serving.speculation import Draft, Drafter, PassCosts, Speculator, Verified
from engine.types import FinishEvent, ModelConfig, SamplingParams, TokenEvent

TEXT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor "
    "jugs. How vexingly quick daft zebras jump! The five boxing wizards jump quickly."
)
REPEAT = f"Repeat this text exactly, word for word:\n\n{TEXT}"
GREEDY = SamplingParams(temperature=0, max_tokens=60)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, top_k=0, seed=7, max_tokens=60)


@pytest.fixture(scope="module")
def svc(smollm2_service):
    svc = smollm2_service.sibling(
        ModelConfig(name="spec", path=smollm2_service.path, max_concurrent=2)
    )
    yield svc
    svc.close()


async def _run(svc, turn: Turn):
    """(token ids, logprobs, text, finish) of choice 0."""
    prepared = prepare_turn(svc, turn)
    ids, logprobs, text, finish = [], [], [], None
    async for ev in svc.generate(prepared.request):
        if isinstance(ev, TokenEvent):
            ids.extend(ev.token_ids)
            logprobs.extend((lp.token, lp.logprob, lp.top) for lp in ev.logprobs)
            text.append(ev.text)
        elif isinstance(ev, FinishEvent):
            finish = ev
    return ids, logprobs, "".join(text), finish


def run(svc, turn: Turn):
    return asyncio.run(_run(svc, turn))


def same(a, b) -> None:
    ids_a, lp_a, text_a, fin_a = a
    ids_b, lp_b, text_b, fin_b = b
    assert ids_a == ids_b
    assert lp_a == lp_b
    assert text_a == text_b
    assert fin_a.finish_reason == fin_b.finish_reason
    usage = dict(cached_tokens=0, accepted_prediction_tokens=0, rejected_prediction_tokens=0)
    assert replace(fin_a.usage, **usage) == replace(fin_b.usage, **usage)
    assert fin_a.stop_sequence == fin_b.stop_sequence
    assert fin_a.response_format_status == fin_b.response_format_status


def user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


CASES = {
    "chat-greedy": Turn(user("Write two sentences about the sea."), sampling=GREEDY),
    "chat-seeded": Turn(user("Write two sentences about the sea."), sampling=SEEDED),
    "repeat-greedy": Turn(user(REPEAT), sampling=GREEDY),
    "repeat-seeded-logprobs": Turn(
        user(REPEAT), sampling=replace(SEEDED, logprobs=True, top_logprobs=3)
    ),
    "repeat-stop": Turn(user(REPEAT), sampling=replace(GREEDY, stop=("zebras",))),
    "repeat-short": Turn(user(REPEAT), sampling=replace(GREEDY, max_tokens=9)),
    "repeat-penalties": Turn(
        user(REPEAT),
        sampling=replace(SEEDED, presence_penalty=0.5, frequency_penalty=0.3),
    ),
    "json-schema": Turn(
        user("Give a name and an age as JSON."),
        sampling=replace(GREEDY, max_tokens=40),
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "p",
                "schema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    "required": ["name", "age"],
                },
            },
        },
    ),
    "tool-required": Turn(
        user("What is the weather in Paris?"),
        sampling=replace(GREEDY, max_tokens=48),
        tools=(
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            },
        ),
        tool_choice="required",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_tokens_with_speculation_off_auto_and_predicted(svc, case):
    turn = CASES[case]
    off = run(svc, replace(turn, speculation="off"))
    same(off, run(svc, replace(turn, speculation="auto")))
    right = run(svc, replace(turn, prediction=off[2]))
    same(off, right)
    wrong = run(svc, replace(turn, prediction="Something else entirely. " + TEXT[::-1]))
    same(off, wrong)


@pytest.fixture
def fresh(smollm2_service):
    """A service of its own: pass costs measured from its first pass. The module's `svc`
    carries the earlier tests' (two streams, long drafts on a loaded host), which may cap
    how many rows a pass verifies: 10 drafted, 10 taken once in the module's run."""
    svc = smollm2_service.sibling(
        ModelConfig(name="spec-copy", path=smollm2_service.path, max_concurrent=2)
    )
    yield svc
    svc.close()


def test_drafts_are_accepted_when_the_answer_copies_the_prompt(fresh):
    svc = fresh
    before = (svc.stats.drafted_tokens, svc.stats.accepted_draft_tokens)
    off = run(svc, replace(CASES["repeat-greedy"], speculation="off"))
    assert (svc.stats.drafted_tokens, svc.stats.accepted_draft_tokens) == before
    auto = run(svc, CASES["repeat-greedy"])
    same(off, auto)
    drafted = svc.stats.drafted_tokens - before[0]
    accepted = svc.stats.accepted_draft_tokens - before[1]
    # The copy was mostly verified, not decoded. (Drafts are cut to what the measured pass
    # costs pay for: on a host loaded ~30x over its cores a full run drafted 18, 16 taken.)
    assert accepted >= 12 and accepted >= 0.6 * drafted, (drafted, accepted)
    predicted = run(svc, replace(CASES["repeat-greedy"], prediction=off[2]))
    same(off, predicted)
    usage = predicted[3].usage
    assert usage.accepted_prediction_tokens >= len(off[0]) // 2, usage
    assert usage.rejected_prediction_tokens < usage.accepted_prediction_tokens


def test_a_model_configured_off_never_drafts(smollm2_service):
    svc = smollm2_service.sibling(
        ModelConfig(name="nospec", path=smollm2_service.path, speculation="off")
    )
    try:
        run(svc, CASES["repeat-greedy"])
        assert svc.stats.drafted_tokens == 0
    finally:
        svc.close()


def test_a_session_turn_two_is_the_same(svc):
    def turns(session: str, speculation: str):
        first = run(
            svc, replace(CASES["repeat-greedy"], session_id=session, speculation=speculation)
        )
        history = (*user(REPEAT), {"role": "assistant", "content": first[2]})
        again = Turn(
            (*history, *user("Now repeat it once more.")),
            sampling=GREEDY,
            session_id=session,
            speculation=speculation,
        )
        return first, run(svc, again)

    off = turns("spec-off", "off")
    auto = turns("spec-auto", "auto")
    same(off[0], auto[0])
    same(off[1], auto[1])
    assert auto[1][3].usage.cached_tokens > 0  # turn 2 resumed from the session


def test_two_streams_speculate_side_by_side(svc):
    async def both(speculation):
        return await asyncio.gather(
            _run(svc, replace(CASES["repeat-greedy"], speculation=speculation)),
            _run(svc, replace(CASES["chat-seeded"], speculation=speculation)),
        )

    off = asyncio.run(both("off"))
    auto = asyncio.run(both("auto"))
    for a, b in zip(off, auto, strict=True):
        same(a, b)


def test_the_drafter_looks_up_the_context_and_follows_the_prediction():
    output: list[int] = []
    d = Drafter([1, 2, 3, 4, 5, 1, 2], output, (), end_ids={9}, max_draft=8)
    assert d.propose(8).tokens == (3, 4, 5, 1)  # after the earlier "1 2", START_DRAFT long
    output += [3]
    assert d.propose(2).tokens == (4, 5)
    # a loop keeps looping past the present; an end of turn ends the draft
    loop = Drafter([7, 8, 7, 8], [], (), end_ids={9}, max_draft=8)
    assert loop.propose(4).tokens == (7, 8, 7, 8)
    ended = Drafter([4, 5, 9, 4, 5], [], (), end_ids={9}, max_draft=8)
    assert ended.propose(4) is None
    # a prediction drafts first, up to 2 * max_draft + 1 tokens within the room given
    # (a pass costs about the same per row past 8 rows), and is found again after a miss
    out: list[int] = []
    p = Drafter([0], out, tuple(range(10, 20)), end_ids=(), max_draft=3)
    assert p.propose(8) == Draft((10, 11, 12, 13, 14, 15, 16), from_prediction=True)
    draft = p.propose(3)
    assert draft == Draft((10, 11, 12), from_prediction=True)
    p.observe(Verified(draft, [10, 11, 20], []))
    assert (p.accepted_prediction, p.rejected_prediction) == (2, 1)
    out += [10, 11, 20]
    assert p.propose(8) is None or not p.propose(8).from_prediction
    out += [13]
    assert p.propose(8).tokens == (14, 15, 16)  # after a miss: accepted + 1 long
    # the context's own drafts stay within max_draft
    assert len(Drafter([7, 8] * 20, [], (), end_ids=(), max_draft=3).propose(8).tokens) <= 3


def test_the_drafter_continues_the_occurrence_that_agrees_furthest_back():
    """Two earlier "5 6 7" continue differently; the context's "1 2 5 6 7" agrees with
    the first one further back, so its continuation is drafted, not the latest's."""
    prompt = [1, 2, 5, 6, 7, 30, 31, 3, 4, 5, 6, 7, 40, 41, 1, 2, 5, 6, 7]
    d = Drafter(prompt, [], (), end_ids=(), max_draft=8)
    assert d.propose(2).tokens == (30, 31)
    # no agreement past the key: the latest occurrence
    latest = Drafter([5, 6, 7, 30, 8, 5, 6, 7, 40, 9, 5, 6, 7], [], (), end_ids=(), max_draft=8)
    assert latest.propose(1).tokens == (40,)


def test_n_two_choices_are_the_same(svc):
    async def choices(speculation):
        prepared = prepare_turn(
            svc, replace(CASES["repeat-seeded-logprobs"], n=2, speculation=speculation)
        )
        ids: dict[int, list[int]] = {}
        async for ev in svc.generate(prepared.request):
            if isinstance(ev, TokenEvent):
                ids.setdefault(ev.index, []).extend(ev.token_ids)
        return ids

    assert asyncio.run(choices("off")) == asyncio.run(choices("auto"))


# --- how many rows a verify pass may have ------------------------------------------------


def test_pass_costs_stop_at_the_first_count_that_costs_more_per_row():
    costs = PassCosts(max_rows=16)
    assert costs.best_rows() == 16  # nothing measured: the drafts may grow
    # SmolLM2 Q4_1 on 2 cores (ms): 8 rows cost 3x one row, 9 rows 4.3x.
    for rows, ms in {1: 6.0, 2: 7.1, 4: 9.7, 7: 15.4, 8: 18.0, 9: 26.0}.items():
        costs.observe(rows, ms / 1e3)
    picks = {costs.best_rows() for _ in range(PassCosts.PROBE_EVERY - 2)}
    assert picks == {8}  # 7 rows are 2.2 ms a row, 8 rows 2.25 (within 10 %), 9 rows 2.9
    # ...and once every PROBE_EVERY steps the pass is uncapped, so 9 is measured again.
    assert costs.best_rows() == 16


def test_pass_costs_allow_counts_not_measured_yet():
    costs = PassCosts(max_rows=8)
    costs.observe(1, 0.006)
    costs.observe(4, 0.010)
    assert costs.best_rows() == 8  # 5 to 8 untried: allowed
    costs.observe(5, 0.030)  # a slow pass: 6 ms a row
    assert costs.best_rows() == 4
    costs.observe(4, 0.020)  # the average moves (0.8 x 10 + 0.2 x 20 = 12 ms: 3 ms a row)
    assert costs.best_rows() == 4
    costs.observe(5, 0.010)  # 0.8 x 30 + 0.2 x 10 = 26 ms: still dearer per row
    assert costs.best_rows() == 4


def test_drafts_are_cut_to_what_their_acceptance_pays_for():
    """Expected tokens per second of the pass: on a dense model's costs a draft pays at
    modest acceptance; on a mixture of experts' (a second row ~1.7x one) only when most
    drafts are accepted."""
    dense, moe = PassCosts(max_rows=16), PassCosts(max_rows=16)
    for rows, ms in {1: 6.0, 2: 7.1, 3: 8.4, 4: 9.7, 5: 11.5, 6: 13.2, 7: 15.4, 8: 18.0}.items():
        dense.observe(rows, ms / 1e3)
    for rows, ms in {1: 9.3, 2: 16.0, 3: 20.0, 4: 24.0, 5: 28.0, 6: 32.0, 7: 36.0, 8: 40.0}.items():
        moe.observe(rows, ms / 1e3)
    for costs in (dense, moe):
        costs.best_rows()  # not a probing step
        assert not costs.probing
    assert dense.paying(1, 7, 0.5) == 1  # 1.5 tokens in 7.1 ms; 1.75 in 8.4 is slower
    assert dense.paying(1, 7, 0.95) == 5  # 8 rows (18 ms) cost more than their tokens
    assert dense.paying(1, 7, 0.05) == 0  # 1.05 tokens in 7.1 ms: slower than no draft
    assert moe.paying(1, 7, 0.5) == 0  # 1.5 tokens in 16 ms < 1 in 9.3 ms
    assert moe.paying(1, 7, 0.95) == 7
    assert moe.paying(1, 12, 0.95) == 12  # 9 rows and more not measured yet: all of it
    assert moe.paying(3, 4, 0.5) == 0  # a pass of two more streams' rows: same verdict
    moe.seconds.pop(3)
    assert moe.paying(3, 4, 0.2) == 4  # a pass of 3 rows not measured: nothing to judge
    for _ in range(PassCosts.PROBE_EVERY - 1 - 1):
        moe.best_rows()
    moe.best_rows()  # every PROBE_EVERY-th step probes: the whole draft is verified
    assert moe.probing and moe.paying(1, 7, 0.0) == 7


def test_a_context_draft_with_low_acceptance_is_not_verified_on_a_dear_pass():
    spec = Speculator("auto", max_draft=7, end_ids=())
    for rows, ms in {1: 9.3, 2: 16.0, 3: 20.0, 4: 24.0, 5: 28.0}.items():
        spec.costs.observe(rows, ms / 1e3)
    output = [5, 6, 7, 8]
    drafter = Drafter([5, 6, 7, 8, 9, 10, 11, 12], output, (), (), 7)
    state = types.SimpleNamespace(forced=False)
    choice = types.SimpleNamespace(drafter=drafter, stopped=False, state=state)
    row = types.SimpleNamespace(seq_id=1, slot=0)
    spec.costs.best_rows()  # past the first (probing) step
    drafter.context_pace.rate = 0.9
    assert spec.drafts([row], {1: choice}, lambda ids: {i: 8 for i in ids})[1].tokens[:2] == (9, 10)
    drafter.context_pace.rate = 0.3
    assert spec.drafts([row], {1: choice}, lambda ids: {i: 8 for i in ids}) == {}


def test_a_speculators_rows_are_at_most_two_streams_with_full_drafts():
    spec = Speculator("auto", max_draft=7, end_ids=())
    assert spec.costs.max_rows == 2 * (1 + 15)  # a prediction's draft: 2 * 7 + 1
