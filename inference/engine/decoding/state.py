"""One sequence's decoding state beyond its KV, and choosing the next token for a batch.

A sequence's next token is, in order: a forced token (the close of a think block whose
reasoning budget is spent), else a draw from its sampler restricted by its grammar (a
response_format constraint, armed once any think block has closed). `choose_rows` does
that for every row of a pass at once: the grammar masks are filled together and the
sampler transforms run vectorised over the rows (sampler.sample_batch), each row still
drawing with its own RNG, so a row's token does not depend on its neighbours.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from .constraints import Constraint, fill_masks
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

    @property
    def wants_grammar(self) -> bool:
        return self._make_constraint is not None

    def arm(self) -> None:
        """Start enforcing the grammar from the next token (after a think block closed)."""
        if self.constraint is None and self._make_constraint is not None:
            self.constraint = self._make_constraint()

    def force(self, token_ids) -> None:
        self.forced.extend(token_ids)

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
    """The next token of each row: `logits` (B, V), states[i] for row i."""
    tokens: list[int | None] = [None] * len(states)
    free = []
    for i, state in enumerate(states):
        if state.forced:
            token = state.forced.popleft()
            tokens[i] = state._commit(forced_sample(state.sampler, logits[i], token), True)
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
    samples = sample_batch([states[i].sampler for i in free], logits[free], masks)
    for i, sample in zip(free, samples, strict=True):
        tokens[i] = states[i]._commit(sample)
    return tokens  # type: ignore[return-value]
