"""Exact speculative decoding: drafted tokens verified in the decode pass.

A sequence's next tokens are guessed (`Drafter`: the client's Predicted Outputs text,
else prompt lookup over the prompt and the tokens generated so far, else the model's
draft model when it has one, draft_model.py: the cheap sources first), fed as extra
rows of the step's one decode pass (its slot, the positions after its last token: rows
bitwise what one-token decode computes there, tests/engine/models/test_verify_rows.py),
and accepted in order (runner.py `accept_drafts`): the token sampled from row i goes
through the sequence's own DecodeState exactly as in a normal step (penalties, bias,
grammar mask, its RNG drawn once per emitted token), and draft i + 1 stands only if that
token equals it. The first mismatch is emitted and ends the step; later rows are thrown
away (their KV lies past the sequence's length and is overwritten before it is read).
So the tokens are those of decoding one at a time, whatever the drafts.

Who speculates (`Speculator.drafts`): a sequence of a request with n == 1 (choices share
slots in turn; n > 1 decodes normally), no think block (its budget forces tokens as they
are pushed), speculation not "off" for the request or the model, and only while at most
MAX_STREAMS sequences decode: with more, the step is compute-bound and extra rows cost
the other streams their share.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

MAX_STREAMS = 2  # speculate only while this few sequences decode
START_DRAFT = 4  # a context draft's first length
# Prompt lookup: the context's last KEY_NGRAM tokens find earlier occurrences; of the
# latest CANDIDATES, the one whose preceding tokens agree with the context's furthest back
# (up to MATCH_BACK) is continued. Else the latest occurrence of the last FALLBACK_NGRAM.
# The longer agreement picks the right one of a code file's repeated lines: on a "print
# this file again" answer 23 passes instead of 33 (bench/RESULTS.md).
KEY_NGRAM = 3
FALLBACK_NGRAM = 2
MATCH_BACK = 16
CANDIDATES = 16
REALIGN_NGRAMS = (4, 3, 2, 1)  # suffix lengths that re-find the output in a prediction
# A prediction's drafts may be this many times max_draft, plus one: past 8 rows a pass
# costs about the same per row (the 4 x 4 tiles), so a prediction that keeps matching
# spreads the pass's fixed cost over more tokens (a 16-row pass on the default 7).
PREDICTION_SPAN = 2


def prediction_draft(max_draft: int) -> int:
    """The longest draft a prediction may make."""
    return PREDICTION_SPAN * max_draft + 1


# A context acceptance rate below this pauses context drafting (a 2-row pass costs ~1.5x
# one row on a 2-core host: drafts that are mostly wrong cost more than they save)...
LOW_RATE = 0.35
PAUSE_STEPS = 16  # ...for this many steps, doubled each time (up to MAX_PAUSE)
MAX_PAUSE = 256


@dataclass
class Draft:
    tokens: tuple[int, ...]
    from_prediction: bool = False
    from_model: bool = False  # the draft model's (draft_model.py)


class Pace:
    """How long a draft source's drafts are: doubled (up to max_draft) after a full
    acceptance, what was accepted + 1 after a miss; paused for a while when its recent
    acceptance falls under LOW_RATE."""

    def __init__(self, max_draft: int):
        self.max_draft = max_draft
        self.length = START_DRAFT
        self.rate = 0.5  # recent acceptance
        self.pause = 0
        self.pause_len = PAUSE_STEPS

    def paused(self) -> bool:
        """Whether it sits this proposal out (a pause counts proposals)."""
        if self.pause > 0:
            self.pause -= 1
            return True
        return False

    def observe(self, drafted: int, accepted: int) -> None:
        self.rate = 0.7 * self.rate + 0.3 * (accepted / drafted)
        if accepted == drafted:
            self.length = min(self.max_draft, self.length * 2)
        else:
            self.length = max(1, accepted + 1)
        if self.rate < LOW_RATE:
            self.pause, self.pause_len = self.pause_len, min(MAX_PAUSE, self.pause_len * 2)
            self.rate, self.length = 0.3, 2


@dataclass
class Verified:
    """One sequence's verify pass: the draft, and per emitted token (the first sampled
    one, then one per accepted draft token) its Sample and the grammar's state after it
    (done, failed), replayed onto the DecodeState as each token is delivered."""

    draft: Draft
    tokens: list[int] = field(default_factory=list)
    marks: list[tuple] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1


class Drafter:
    """One sequence's draft sources: its context (prompt + output) indexed by n-gram, its
    prediction with the position where the output is expected to continue it, and the
    draft model's slots (DraftSlots) when the model has one."""

    def __init__(
        self,
        prompt: Sequence[int],
        output: list[int],
        prediction: Sequence[int],
        end_ids: Collection[int],
        max_draft: int,
        model=None,
    ):
        self.prompt = prompt
        self.output = output  # the choice's emitted tokens (a live list, ChoiceOutput's)
        self.end_ids = frozenset(end_ids)
        self.max_draft = max(1, max_draft)
        self.ctx: list[int] = []
        self._indexed = 0  # ctx positions whose preceding n-grams are in the index
        # KEY_NGRAM-gram -> the positions after its occurrences, in order
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._fallback: dict[tuple[int, ...], int] = {}  # FALLBACK_NGRAM-gram -> latest
        self.prediction = tuple(prediction)
        self._pred_index: dict[tuple[int, ...], list[int]] | None = None
        self.pred_pos: int | None = 0 if self.prediction else None
        self._synced = 0  # output tokens followed through the prediction
        self.max_prediction = prediction_draft(self.max_draft)
        self.pred_length = self.max_prediction  # a prediction is trusted until it misses
        self.context_pace = Pace(self.max_draft)
        self.model = model  # DraftSlots, or None
        self.model_pace = Pace(self.max_draft)
        self.accepted_prediction = 0
        self.rejected_prediction = 0

    # --- proposing ----------------------------------------------------------------------

    def propose(self, room: int, slot: int | None = None) -> Draft | None:
        """At most `room` tokens to verify after the output's last token, or None; the
        draft model drafts on the sequence's `slot`."""
        if room <= 0:
            return None
        self._follow_prediction()
        if self.pred_pos is not None and self.pred_pos < len(self.prediction):
            end = self.pred_pos + min(room, self.pred_length)
            tokens = self._clean(self.prediction[self.pred_pos : end])
            if tokens:
                return Draft(tokens, from_prediction=True)
        room = min(room, self.max_draft)
        if not self.context_pace.paused():
            tokens = self._clean(self._lookup(min(room, self.context_pace.length)))
            if tokens:
                return Draft(tokens)
        if self.model is None or slot is None or self.model_pace.paused():
            return None
        n_tokens = min(room, self.model_pace.length)
        tokens = self._clean(self.model.propose(slot, self._context(), n_tokens))
        return Draft(tokens, from_model=True) if tokens else None

    def observe(self, verified: Verified) -> None:
        """Adapt to a verify pass's outcome (the tokens it emitted are in `output` by the
        next proposal)."""
        drafted, accepted = len(verified.draft.tokens), verified.accepted
        if verified.draft.from_prediction:
            self.accepted_prediction += accepted
            self.rejected_prediction += drafted - accepted
            full = accepted == drafted
            self.pred_length = self.max_prediction if full else max(2, accepted + 1)
            return
        pace = self.model_pace if verified.draft.from_model else self.context_pace
        pace.observe(drafted, accepted)

    def _clean(self, tokens: Sequence[int]) -> tuple[int, ...]:
        """A draft stops before an end of turn: the sequence would end there anyway."""
        out = []
        for t in tokens:
            if t in self.end_ids:
                break
            out.append(int(t))
        return tuple(out)

    # --- the context ------------------------------------------------------------------

    def _lookup(self, n_tokens: int) -> tuple[int, ...]:
        """Prompt lookup: the tokens that followed the earlier occurrence of the context's
        last tokens that agrees with it furthest back (see KEY_NGRAM); a continuation that
        runs into the present repeats its period (a loop keeps looping)."""
        ctx = self._context()
        at = self._best_occurrence(ctx)
        if at is None:
            return ()
        period = len(ctx) - at
        draft: list[int] = []
        for i in range(n_tokens):
            draft.append(ctx[at + i] if at + i < len(ctx) else draft[i - period])
        return tuple(draft)

    def _best_occurrence(self, ctx: list[int]) -> int | None:
        """The position after the best earlier occurrence of the context's suffix."""
        end = len(ctx)
        if end > KEY_NGRAM:
            best, at = -1, None
            for pos in reversed(self._index.get(tuple(ctx[-KEY_NGRAM:]), ())[-CANDIDATES:]):
                agree = KEY_NGRAM
                while (
                    agree < MATCH_BACK
                    and pos - agree > 0
                    and ctx[pos - agree - 1] == ctx[end - agree - 1]
                ):
                    agree += 1
                if agree > best:  # ties: the latest (visited first)
                    best, at = agree, pos
            if at is not None:
                return at
        if end > FALLBACK_NGRAM:
            return self._fallback.get(tuple(ctx[-FALLBACK_NGRAM:]))
        return None

    def _context(self) -> list[int]:
        """prompt + output, with every n-gram that has a successor indexed."""
        ctx = self.ctx
        if not ctx and self.prompt:
            ctx.extend(self.prompt)
        have = len(ctx) - len(self.prompt)
        if have < len(self.output):
            ctx.extend(self.output[have:])
        index, fallback = self._index, self._fallback
        for j in range(max(self._indexed, 1), len(ctx)):
            if j >= KEY_NGRAM:
                index.setdefault(tuple(ctx[j - KEY_NGRAM : j]), []).append(j)
            if j >= FALLBACK_NGRAM:
                fallback[tuple(ctx[j - FALLBACK_NGRAM : j])] = j
        self._indexed = len(ctx)
        return ctx

    # --- the prediction -----------------------------------------------------------------

    def _follow_prediction(self) -> None:
        """Move the prediction's cursor over the tokens emitted since the last proposal;
        lost on a mismatch, re-found from the output's last tokens."""
        if not self.prediction:
            return
        output, pred = self.output, self.prediction
        while self._synced < len(output):
            token = output[self._synced]
            self._synced += 1
            if (
                self.pred_pos is not None
                and self.pred_pos < len(pred)
                and pred[self.pred_pos] == token
            ):
                self.pred_pos += 1
            else:
                self.pred_pos = None
        if self.pred_pos is None:
            self.pred_pos = self._realign()

    def _realign(self) -> int | None:
        """Where the prediction continues the output's last tokens (the first occurrence
        of its longest suffix found), or None."""
        if self._pred_index is None:
            self._pred_index = {}
            pred = self.prediction
            for n in REALIGN_NGRAMS:
                for end in range(n, len(pred) + 1):
                    self._pred_index.setdefault(tuple(pred[end - n : end]), []).append(end)
        for n in REALIGN_NGRAMS:
            if len(self.output) < n:
                continue
            ends = self._pred_index.get(tuple(self.output[-n:]))
            if ends:
                return ends[0]
        return None


class PassCosts:
    """What a decode pass of r rows costs on this model and machine (a moving average of
    the loop's measured passes), and so how many rows a step may verify: up to the first
    row count past the cheapest that is known to cost more per row (on SmolLM2 Q4_1 on
    2 cores: 8 rows ~3.0x one row, 9 rows ~4.3x, as the 8-row tile starts over). Counts
    not measured yet are allowed, so drafts grow until a dear count is met; every
    PROBE_EVERY-th step is uncapped, so one slow pass on a busy host is measured again
    rather than ruling its count out for good."""

    PROBE_EVERY = 32
    TOLERANCE = 1.1  # within this of the lowest cost per row, a count is as good

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self.seconds: dict[int, float] = {}  # rows -> average seconds of such a pass
        self._asked = 0
        self.probing = True  # the last best_rows was uncapped: nothing else caps either

    def observe(self, rows: int, seconds: float) -> None:
        prev = self.seconds.get(rows)
        self.seconds[rows] = seconds if prev is None else 0.8 * prev + 0.2 * seconds

    def best_rows(self) -> int:
        """The most rows a pass should have (at least 1, at most max_rows)."""
        self._asked += 1
        self.probing = not self.seconds or self._asked % self.PROBE_EVERY == 0
        if self.probing:
            return self.max_rows
        per_row = {r: t / r for r, t in self.seconds.items()}
        cheapest = min(per_row.values())
        best = max(r for r, c in per_row.items() if c <= cheapest * self.TOLERANCE)
        dear = min((r for r in per_row if r > best), default=self.max_rows + 1)
        return min(dear - 1, self.max_rows)

    def paying(self, rows: int, drafted: int, rate: float) -> int:
        """How many of `drafted` tokens to verify in a pass that already has `rows` rows,
        each accepted with probability `rate` when the one before it was (the source's
        recent acceptance): the count with the most expected tokens per second of the
        pass. A row costs little on a dense model (8 rows ~3x one on SmolLM2), so drafts
        pay at modest acceptance; on a mixture of experts each row reads experts of its
        own (8 rows ~4.3x one on the synthetic qwen3moe, 2 rows ~1.7x), so drafts mostly
        refused had made its decode 5-10 % slower than no speculation. All `drafted`
        where a count is not measured yet, or on a probing step (best_rows), so every
        count keeps being measured and a refused source is tried again."""
        base = self.seconds.get(rows)
        if self.probing or base is None or drafted <= 0:
            return drafted
        best, best_pace = 0, rows / base
        expected, chance = float(rows), 1.0
        for k in range(1, drafted + 1):
            cost = self.seconds.get(rows + k)
            if cost is None:
                return drafted
            chance *= rate
            expected += chance
            if expected / cost > best_pace:
                best, best_pace = k, expected / cost
        return best


class Speculator:
    """The engine loop's speculation policy: which sequences draft this step, and how
    many tokens (the scheduler says how many more each may take)."""

    def __init__(self, mode: str, max_draft: int, end_ids: Collection[int], draft=None):
        self.enabled = mode != "off"
        self.max_draft = max_draft
        self.end_ids = frozenset(end_ids)
        self.draft = draft  # the model's DraftSlots (draft_model.py), or None
        self.costs = PassCosts(MAX_STREAMS * (1 + prediction_draft(max_draft)))

    def drafter(self, request, output: list[int]) -> Drafter | None:
        """A choice's drafter, or None where it never speculates (see the module doc)."""
        if not self.enabled or request.speculation == "off" or request.n != 1:
            return None
        if request.think_style:
            return None
        return Drafter(
            request.prompt_ids,
            output,
            request.prediction,
            self.end_ids,
            self.max_draft,
            self.draft,
        )

    def wants(self, n_rows: int) -> bool:
        """Whether a step of this many decode rows speculates at all."""
        return self.enabled and 0 < n_rows <= MAX_STREAMS

    def drafts(self, rows, choices: Mapping[int, object], rooms_of) -> dict[int, Draft]:
        """{seq_id: Draft} for the step's decode rows that draft: `choices` the loop's
        (their drafter and decode state), `rooms_of(seq_ids)` the scheduler's draft_room."""
        if not self.wants(len(rows)):
            return {}
        slots = {row.seq_id: row.slot for row in rows}
        drafters = {
            row.seq_id: ch.drafter
            for row in rows
            if (ch := choices.get(row.seq_id)) is not None
            and ch.drafter is not None
            and not ch.stopped
            and not ch.state.forced  # a forced token is pushed before the next is chosen
        }
        if not drafters:
            return {}
        rooms = rooms_of(list(drafters))
        # The rows beyond the step's own that pay (PassCosts), shared among the drafters.
        share = max(0, self.costs.best_rows() - len(rows)) // len(drafters)
        out = {}
        pass_rows = len(rows)
        for seq_id, drafter in drafters.items():
            draft = drafter.propose(min(share, rooms.get(seq_id, 0)), slots[seq_id])
            if draft is None:
                continue
            if not draft.from_prediction:  # a prediction is trusted until it misses
                pace = drafter.model_pace if draft.from_model else drafter.context_pace
                keep = self.costs.paying(pass_rows, len(draft.tokens), pace.rate)
                if keep == 0:
                    continue
                draft = replace(draft, tokens=draft.tokens[:keep])
            pass_rows += len(draft.tokens)
            out[seq_id] = draft
        return out

    def observe(self, verified: Mapping[int, Verified], choices: Mapping, stats) -> None:
        """A step's verify passes: counted (EngineStats) and told to their drafters."""
        for seq_id, done in verified.items():
            stats.drafted_tokens += len(done.draft.tokens)
            stats.accepted_draft_tokens += done.accepted
            if done.draft.from_model:
                stats.model_drafted_tokens += len(done.draft.tokens)
                stats.model_accepted_tokens += done.accepted
            ch = choices.get(seq_id)
            if ch is not None and ch.drafter is not None:
                ch.drafter.observe(done)
