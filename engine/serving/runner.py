"""Batch -> forward passes -> logits -> sampled ids. Owns nothing but timings.

Each prefill chunk is its own forward pass on its sequence's slot (chunk boundaries are
fixed per prompt, so a prompt is computed the same way whatever else runs); all decode
rows go through one batched pass (`forward_decode`, batch invariant, every architecture),
and so does a prompt's one-token last chunk (a prompt resumed from cached KV all but its
last token: the same work as decoding that token), so that eight such requests admitted
together cost one pass instead of eight. Where the backend allows (its prefill product is
row-independent), the step's longer prompt chunks share one packed pass too: one walk
over the weights for several prompts arriving together, each chunk's bits unchanged.
Each sequence
chooses its token through its own DecodeState (decoding/state.py: forced tokens, grammar mask,
its own sampler and RNG), so its random stream does not depend on its neighbours.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..decoding.state import DecodeState, choose_rows
from .batch import Batch, DecodeRow, PrefillChunk
from .speculation import Draft, Verified


@dataclass
class StepTimes:
    """Seconds spent on the last batch's prefill chunks and on its decode pass."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_rows: int = 0
    decode_s: float = 0.0
    pass_rows: int = 0  # rows of the decode pass, drafts included (speculation.PassCosts)


class Runner:
    def __init__(self, model, kv):
        # kv: the KV cache the model's backend made (model.make_kv_cache)
        self.model = model
        self.kv = kv
        self.last = StepTimes()
        self.verified: dict[int, Verified] = {}  # the last step's verify passes

    def run(
        self,
        batch: Batch,
        states: Mapping[int, DecodeState],
        drafts: Mapping[int, Draft] | None = None,
    ) -> dict[int, int]:
        """Run one step; returns {seq_id: sampled token id} for batch.sampling_seq_ids()
        (those with a decode state: a sequence cancelled meanwhile has none). `drafts`:
        tokens to verify after some decode rows (speculation.py); what each emitted past
        its first token is in `self.verified`."""
        sampled: dict[int, int] = {}
        self.verified = {}
        times = StepTimes()
        t0 = time.perf_counter()
        folded = [c for c in batch.prefill if _one_token_last_chunk(c)]
        for chunk, logits in self._prefill([c for c in batch.prefill if c not in folded]):
            times.prefill_tokens += len(chunk.token_ids)
            if chunk.sample_seq_ids:
                end = chunk.start + len(chunk.token_ids)
                for slot in chunk.copy_to_slots:
                    self.kv.copy_prefix(chunk.slot, slot, end)
                seq_ids = [s for s in chunk.sample_seq_ids if s in states]  # else cancelled
                if seq_ids:
                    rows = np.broadcast_to(logits, (len(seq_ids), logits.shape[-1]))
                    tokens = choose_rows([states[s] for s in seq_ids], rows)
                    sampled.update(zip(seq_ids, tokens, strict=True))
        t1 = time.perf_counter()
        times.prefill_s = t1 - t0
        rows = (
            *batch.decode,
            *(DecodeRow(c.seq_id, c.slot, c.start, c.token_ids[0]) for c in folded),
        )
        if rows:
            drafts = {s: d for s, d in (drafts or {}).items() if s in states}
            extra = verify_rows(batch.decode, drafts)
            logits = self._decode((*rows, *extra), states)
            live = [i for i, row in enumerate(rows) if row.seq_id in states]
            if live:
                # All rows live (the usual step): the logits as they are, not a copy (a
                # fancy index of a B = 8 step's 1.5 MB is a fresh map, page-faulted).
                live_logits = logits if len(live) == len(logits) else logits[live]
                tokens = self._choose([states[rows[i].seq_id] for i in live], live_logits)
                sampled.update((rows[i].seq_id, t) for i, t in zip(live, tokens, strict=True))
            if drafts:
                first: dict[int, int] = {}  # seq_id -> the logits row of its first draft
                for i, row in enumerate(extra):
                    first.setdefault(row.seq_id, len(rows) + i)
                self.verified = self._accept(drafts, first, states, sampled, logits)
            times.decode_rows = len(rows) + sum(v.accepted for v in self.verified.values())
            times.decode_s = time.perf_counter() - t1
            times.pass_rows = len(rows) + len(extra)
        self.last = times
        return sampled

    def _prefill(self, chunks):
        """(chunk, its last-token logits) for each chunk: the chunks the model can pack
        (see models._block.PackedPrefill) in one pass when there are two or more, the
        others one pass each. Same bits either way."""
        packable = getattr(self.model, "packable", None)
        packed = [c for c in chunks if packable and packable(len(c.token_ids))]
        if len(packed) < 2:
            packed = []
        else:
            parts = [(c.token_ids, c.start, c.slot) for c in packed]
            yield from zip(packed, self.model.forward_packed(parts, self.kv), strict=True)
        for chunk in chunks:
            if chunk not in packed:
                tokens = np.asarray(chunk.token_ids, dtype=np.int64)
                yield chunk, self.model.forward(tokens, chunk.start, self.kv, chunk.slot)

    def _decode(self, rows, states: Mapping[int, DecodeState]) -> np.ndarray:
        """Logits (B, V) of one decode step: all rows in one batched pass, left where the
        backend computed them (a GPU's: sampled there). A greedy row's may hold only what
        its argmax needs (DecodeState.argmax_bans); a cancelled sequence's row is read by
        nobody, so it asks for the least."""
        argmax = [states[r.seq_id].argmax_bans if r.seq_id in states else frozenset() for r in rows]
        return self.model.forward_decode(
            [r.token_id for r in rows],
            [r.position for r in rows],
            [r.slot for r in rows],
            self.kv,
            keep_on_device=True,
            argmax=argmax,
        )

    def _accept(self, drafts, first_row, states, sampled, logits) -> dict[int, Verified]:
        """Speculation's acceptance (speculation.py): each drafting sequence's rows in
        order, every row's token chosen by its DecodeState as in a one-token step; draft
        i + 1 is checked only when the token chosen from row i equals draft i."""
        verified = {}
        active: dict[int, int] = {}  # seq_id -> the verify row to sample next
        for seq_id, draft in drafts.items():
            state = states[seq_id]
            verified[seq_id] = Verified(draft, [sampled[seq_id]], [state.mark()])
            if sampled[seq_id] == draft.tokens[0] and not state.grammar_done:
                active[seq_id] = 0
        while active:
            seq_ids = list(active)
            index = [first_row[s] + active[s] for s in seq_ids]
            tokens = self._choose([states[s] for s in seq_ids], logits[index])
            following = {}
            for seq_id, token in zip(seq_ids, tokens, strict=True):
                done = verified[seq_id]
                done.tokens.append(token)
                done.marks.append(states[seq_id].mark())
                i = active[seq_id] + 1
                draft = drafts[seq_id].tokens
                if i < len(draft) and token == draft[i] and not states[seq_id].grammar_done:
                    following[seq_id] = i
            active = following
        return verified

    def _choose(self, states: list[DecodeState], logits) -> list[int]:
        """choose_rows where the logits are: on a model on dies, the last die's thread
        (its device current); on the host, here."""
        on_die = getattr(self.model, "on_last_die", None)
        return on_die(choose_rows, states, logits) if on_die else choose_rows(states, logits)


def verify_rows(decode: tuple[DecodeRow, ...], drafts: Mapping[int, Draft]) -> list[DecodeRow]:
    """The rows that check drafts: after a sequence's decode row, its drafted tokens at
    the positions that follow, on its slot (one pass; each row as if decoded alone)."""
    return [
        DecodeRow(row.seq_id, row.slot, row.position + 1 + i, token)
        for row in decode
        if (draft := drafts.get(row.seq_id)) is not None
        for i, token in enumerate(draft.tokens)
    ]


def _one_token_last_chunk(chunk: PrefillChunk) -> bool:
    """A prompt's last chunk of one token, sampled for its own sequence only: a decode row."""
    return (
        len(chunk.token_ids) == 1
        and not chunk.copy_to_slots
        and chunk.sample_seq_ids == (chunk.seq_id,)
    )
