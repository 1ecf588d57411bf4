"""Catch a decode that is stuck in a loop, so it ends with `finish_reason: "repetition_loop"`
instead of burning its whole `max_tokens` on the same text.

The rule: the output's tail is exactly periodic — the last `span` tokens repeat a block of
`period` tokens — with at least MIN_REPEATS copies of the block and at least MIN_SPAN
tokens in all, for some period up to MAX_PERIOD tokens. So a sentence of 20 tokens said
four times in a row (80 tokens) is a loop, and one token repeated 64 times is a loop;
but a list of numbers ("1, 2, 3, ...") never is (its tokens change), nor is a table or
code with repeated lines that differ anywhere, nor a short refrain repeated a few times.

Per token it compares the new token with the one `period` back for every period at once
(a ring buffer and one vectorised comparison): the run length of matches for period L
is how far back the tail has been L-periodic.
"""

from __future__ import annotations

import numpy as np

MAX_PERIOD = 128
MIN_SPAN = 64
MIN_REPEATS = 4


class LoopDetector:
    def __init__(
        self, max_period: int = MAX_PERIOD, min_span: int = MIN_SPAN, min_repeats: int = MIN_REPEATS
    ):
        self.max_period = max_period
        self.periods = np.arange(1, max_period + 1)
        # Matches needed for period L: the span (run + L) covers min_repeats blocks and
        # min_span tokens.
        self.needed = np.maximum(self.periods * (min_repeats - 1), min_span - self.periods)
        self._ring = np.full(max_period, -1, dtype=np.int64)  # last tokens, newest at _n - 1
        self._runs = np.zeros(max_period, dtype=np.int64)
        self._n = 0
        self.fired_period = 0

    def push(self, token_id: int) -> bool:
        """Add one generated token; True once the output is caught looping."""
        n, size = self._n, self.max_period
        # ring[(n - L) % size] is the token L back (valid while L <= n).
        back = self._ring[(n - self.periods) % size]
        same = (back == token_id) & (self.periods <= n)
        self._runs = np.where(same, self._runs + 1, 0)
        self._ring[n % size] = token_id
        self._n = n + 1
        hits = np.flatnonzero(self._runs >= self.needed)
        if hits.size:
            self.fired_period = int(self.periods[hits[0]])
            return True
        return False
