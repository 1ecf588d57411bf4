"""Hold back streamed text that might be the start of a stop string.

A stop string can be split across tokens, so text is released only once it cannot be
part of one; the stop text itself is never released.
"""

from __future__ import annotations


class StopStringBuffer:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.stopped = False
        self.matched = ""  # the stop string that ended the text (the earliest match)

    def push(self, text: str) -> str:
        """Add decoded text; return what is safe to emit now. Sets `stopped` on a match."""
        if not self.stops:
            return text
        self.pending += text
        hits = [(i, s) for i, s in ((self.pending.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            out, self.pending, self.stopped = self.pending[:at], "", True
            return out
        keep = self._longest_stop_prefix_suffix()
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """End of generation without a match: the held-back text is ordinary text."""
        out, self.pending = self.pending, ""
        return out

    def _longest_stop_prefix_suffix(self) -> int:
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(stop[:n]):
                    best = n
                    break
        return best
