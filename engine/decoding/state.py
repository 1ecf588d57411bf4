"""One sequence's decoding state beyond its KV, and choosing the next token for a batch.

A sequence's next token is, in order: a forced token (the close of a think block whose
reasoning budget is spent), else a draw from its sampler restricted by its grammar (a
response_format constraint, armed once any think block has closed). `choose_rows` does
that for every row of a pass at once: the grammar masks are filled together and the
sampler transforms run vectorised over the rows (sampler.sample_batch), each row still
drawing with its own RNG, so a row's token does not depend on its neighbours. Logits
in a device's memory (the GPU backend's) are sampled there (device_sampling.py): only
the tokens and the logprobs asked for come back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from kernels import array_module

from .constraints import Constraint, fill_masks
from .device_sampling import forced_sample_on, sample_batch_on
from .sampler import Sample, Sampler, forced_sample, sample_batch


class DecodeState:
    def __init__(self, sampler: Sampler, make_constraint: Callable[[], Constraint] | None = None):
        self.sampler = sampler
        self._make_constraint = make_constraint
        self.constraint: Constraint | None = None
        self.grammar_failed = False  # the grammar allowed nothing: decoding went on unconstrained
        self.forced: deque[int] = deque()
        self.last: Sample | None = None  # the token chosen at the last step
        self.last_forced = False  # ... and whether it was forced rather than drawn
        self._replayed_done: bool | None = None  # replay(): grammar_done as of a mark

    @property
    def wants_grammar(self) -> bool:
        return self._make_constraint is not None

    def arm(self) -> None:
        """Start enforcing the grammar from the next token (after a think block closed)."""
        if self.constraint is None and self._make_constraint is not None:
            self.constraint = self._make_constraint()

    @property
    def argmax_bans(self) -> frozenset[int] | None:
        """The ids banned from this sequence's next token when that token is its logits'
        argmax among the rest (plain greedy, no grammar): the decode pass may then skip
        every logit that cannot be the largest (DecoderModel.forward_decode's `argmax`).
        None: the token reads more of the row (a draw, penalties, logprobs, a mask)."""
        sampler = self.sampler
        if sampler.plain_greedy and self._make_constraint is None:
            return sampler.banned
        return None

    def force(self, token_ids) -> None:
        self.forced.extend(token_ids)

    @property
    def grammar_done(self) -> bool:
        """The grammar accepts nothing more: the answer is complete."""
        if self._replayed_done is not None:
            return self._replayed_done
        c = self.constraint
        return c is not None and not self.grammar_failed and c.done

    def mark(self) -> tuple:
        """What the output reads of this state after a token (its Sample, the grammar's
        done and failed): kept per token of a speculative step, which samples several
        tokens before the output sees the first (serving/speculation.py)."""
        return (self.last, self.grammar_done, self.grammar_failed)

    def replay(self, mark: tuple | None) -> None:
        """Show the output the state as it was after one of a step's tokens (`mark`);
        None: the state as it is (after the step's last token)."""
        if mark is None:
            self._replayed_done = None
            return
        self.last, self._replayed_done, self.grammar_failed = mark

    def _commit(self, sample: Sample, forced: bool = False) -> int:
        token = sample.token_id
        self.last_forced = forced
        self.sampler.accept(token)
        if self.constraint is not None and not self.grammar_failed:
            try:
                self.constraint.accept(token)
            except ValueError:  # a forced token the grammar did not expect
                self.grammar_failed = True
        self.last = sample
        return token


def choose_rows(states: list[DecodeState], logits: np.ndarray) -> list[int]:
    """The next token of each row: `logits` (B, V), states[i] for row i. A numpy array is
    sampled on the host; anything else (a CuPy array; a numpy subclass in the tests) by
    the same steps as array code over its module, where it lies."""
    on_host = type(logits) is np.ndarray
    xp = np if on_host else array_module(logits)
    tokens: list[int | None] = [None] * len(states)
    free = []
    for i, state in enumerate(states):
        if state.forced:
            token = state.forced.popleft()
            if on_host:
                sample = forced_sample(state.sampler, logits[i], token)
            else:
                sample = forced_sample_on(xp, state.sampler, logits[i], token)
            tokens[i] = state._commit(sample, True)
        else:
            free.append(i)
    if not free:
        return tokens  # type: ignore[return-value]
    constraints = [states[i].constraint if not states[i].grammar_failed else None for i in free]
    masks = fill_masks(constraints)
    for k, (i, mask) in enumerate(zip(free, masks, strict=True)):
        if mask is not None and not mask.any():  # nothing allowed: never hang, say so
            states[i].grammar_failed = True
            masks[k] = None
    samplers = [states[i].sampler for i in free]
    # All rows free (the usual step): no copy of the logits (on the host a B = 8 row
    # block is 1.5 MB, a fresh map each step).
    rows = logits if len(free) == len(states) else logits[free]
    if on_host:
        samples = sample_batch(samplers, rows, masks)
    else:
        samples = sample_batch_on(xp, samplers, rows, masks)
    for i, sample in zip(free, samples, strict=True):
        tokens[i] = states[i]._commit(sample)
    return tokens  # type: ignore[return-value]
