"""A draft model for speculation: a small GGUF with the served model's vocabulary, run
greedily a few tokens ahead of a sequence where its context and its prediction draft
nothing (speculation.py `Drafter`). It only proposes: the served model verifies each
token exactly as before (runner.py), so the output is the same whatever it says.

Its KV cache has one slot per served slot, and what each slot holds is kept as tokens:
a proposal keeps the longest held prefix the sequence's context still starts with and
computes on from there. After a verify pass the rejected draft tokens are dropped that
way (the cache rolls back to the accepted length) and only the accepted ones and the new
token are fed; a slot reused by another sequence, or a session resumed in another slot,
catches up the same way. A long catch-up (a new prompt) takes one chunk per step and
drafts once done, so it holds the other streams up by one chunk at most.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..loading.gguf_file import GGUFFile
from ..loading.model_load import load_model
from ..types import IncompatibleDraftModel, ModelConfig, UnsupportedArchitecture

log = logging.getLogger("pantheon.engine.service")

CATCH_UP_CHUNK = 256  # context tokens the draft model computes per step at most


@dataclass(frozen=True)
class DraftModel:
    """A loaded draft: its weights (as loading/model_load.py returns them) and its file."""

    model: object
    path: str
    architecture: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def vocabulary(gf: GGUFFile) -> tuple[int, str]:
    """A GGUF's vocabulary as (token count, sha256 of its token texts in order)."""
    tokens = gf.metadata.get("tokenizer.ggml.tokens") or []
    text = "\0".join(str(t) for t in tokens).encode("utf-8", "surrogatepass")
    return len(tokens), hashlib.sha256(text).hexdigest()


def load_draft(config: ModelConfig, target: GGUFFile) -> DraftModel | None:
    """The draft `config.draft_model` names, loaded beside `target` (same backend, its
    last die), or None without one or with speculation off. Raises IncompatibleDraftModel
    when its vocabulary differs from the target's or its architecture is not one the
    engine runs."""
    if not config.draft_model or config.speculation == "off":
        return None
    draft_config = replace(
        config,
        name=f"{config.name} draft",
        path=config.draft_model,
        draft_model="",
        chat_template="",
        dies=config.dies[-1:],
    )
    try:
        loaded = load_model(draft_config)
    except UnsupportedArchitecture as exc:
        raise IncompatibleDraftModel(f"draft_model: {exc}") from None
    mine, theirs = vocabulary(target), vocabulary(loaded.gguf)
    if mine != theirs:
        raise IncompatibleDraftModel(
            f"draft_model: {loaded.gguf.path.name} has another vocabulary than "
            f"{target.path.name} ({theirs[0]} tokens, sha256 {theirs[1][:12]}; "
            f"the model's: {mine[0]} tokens, sha256 {mine[1][:12]}); a draft model must "
            "share the served model's tokens"
        )
    log.info(
        "%s: draft model %s (%s)", config.name, loaded.gguf.path.name, loaded.gguf.architecture
    )
    return DraftModel(loaded.model, str(loaded.gguf.path), loaded.gguf.architecture)


class DraftSlots:
    """One service's use of a draft model: its KV cache (a slot per served slot), what
    each slot holds, and the greedy proposals. The engine thread's alone."""

    def __init__(
        self,
        draft: DraftModel,
        slots: int,
        window: int,
        vocab_size: int,
        end_ids: Collection[int],
    ):
        self.draft = draft
        self.window = min(window, draft.model.hp.n_ctx_train)
        self.kv = draft.model.make_kv_cache(slots, self.window)
        self.vocab_size = vocab_size
        self.end_ids = frozenset(end_ids)
        self._held: list[list[int]] = [[] for _ in range(slots)]  # tokens whose KV it holds
        self.failed = False  # a pass raised: no more drafts from it (logged once)

    @classmethod
    def of(cls, draft: DraftModel | None, mode: str, tokenizer, slots: int, window: int):
        """A service's DraftSlots, or None (no draft model, or speculation off)."""
        if draft is None or mode == "off":
            return None
        return cls(draft, slots, window, tokenizer.vocab_size, tokenizer.end_of_turn_ids)

    def propose(self, slot: int, context: Sequence[int], n_tokens: int) -> tuple[int, ...]:
        """At most `n_tokens` greedy tokens to follow `context` (a sequence's prompt and
        output) on `slot`; () while its context is still being caught up, past the
        window, or once a pass failed."""
        if self.failed or n_tokens <= 0 or not context:
            return ()
        if len(context) + n_tokens > self.window:
            return ()
        try:
            return self._propose(slot, context, n_tokens)
        except Exception:
            log.exception("draft model %s failed; drafting without it", self.draft.name)
            self.failed = True
            return ()

    def _propose(self, slot: int, context: Sequence[int], n_tokens: int) -> tuple[int, ...]:
        model, held = self.draft.model, self._held[slot]
        last = len(context) - 1  # the last token is fed below, for its logits
        keep = 0
        while keep < min(len(held), last) and held[keep] == context[keep]:
            keep += 1
        del held[keep:]  # a rejected draft, or another sequence's tokens
        if keep < last:
            end = min(last, keep + CATCH_UP_CHUNK)
            model.forward(np.asarray(context[keep:end], dtype=np.int64), keep, self.kv, slot)
            held.extend(int(t) for t in context[keep:end])
            if end < last:
                return ()
        token, out = int(context[last]), []
        while len(out) < n_tokens:
            logits = model.forward_decode([token], [len(held)], [slot], self.kv)
            held.append(token)
            token = int(np.argmax(logits[0]))
            if token >= self.vocab_size:
                break
            out.append(token)
            if token in self.end_ids:  # the draft ends there (Drafter._clean)
                break
        return tuple(out)
