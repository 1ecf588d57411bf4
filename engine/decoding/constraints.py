"""Structured output: an OpenAI `response_format` -> an llguidance grammar -> token masks.

`plan_response_format` (response_format.py) compiles a request's response_format once
(no model needed); `Constraint`, here, is one sequence's matcher over one model's
vocabulary (`GrammarTokenizer`); `validate_output` (schema_check.py) checks the finished
text against the schema, so a value cut short by max_tokens, or a schema feature the
grammar could not enforce, is reported, never passed off as conformant;
`check_output_async` runs that check off the engine thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import llguidance
import llguidance.numpy as llnp
import numpy as np

from engine.decoding.response_format import (
    ConstraintPlan,
    closed_objects,
    plan_response_format,
)
from engine.decoding.schema_check import (
    VALIDATION_TIMEOUT_S,
    OutputVerdict,
    check_output,
    validate_output,
)
from engine.text.tokenizer import TOKEN_CONTROL

# Constrained decoding's names, with those of the two modules it stands on.
__all__ = [
    "VALIDATION_TIMEOUT_S",
    "Constraint",
    "ConstraintPlan",
    "GrammarTokenizer",
    "OutputVerdict",
    "check_output",
    "check_output_async",
    "closed_objects",
    "fill_masks",
    "plan_response_format",
    "validate_output",
]

# The final answer's check runs on a pool of its own (check_output_async).
VALIDATION_WORKERS = 2

log = logging.getLogger(__name__)

_GRAMMAR_TOKENIZER_ATTR = "_grammar_tokenizer"
_build_lock = threading.Lock()
_executor: llguidance.LLExecutor | None = None
_validation_pool: ThreadPoolExecutor | None = None


class _VocabView:
    """The duck-typed `TokenizerWrapper` that llguidance.LLTokenizer reads a vocabulary from."""

    is_tokenizer_wrapper = True

    def __init__(self, tok: Any, special: list[int], eos: int | None):
        self.tokens = list(tok._bytes)
        self.eos_token_id = eos
        self.bos_token_id = tok.bos_id
        # llguidance prefixes these with its 0xFF marker: never spelled by grammar text.
        self.special_token_ids = special
        self._encode = tok.encode
        skip = set(special)
        self._id_of: dict[bytes, int] = {}
        for i, piece in enumerate(self.tokens):
            if piece and i not in skip:
                self._id_of.setdefault(piece, i)

    def __call__(self, text: str) -> list[int]:
        """Ids spelling exactly `text`: llguidance trusts them for the bytes a grammar forces."""
        want = text.encode("utf-8")
        ids = self._encode(text)
        spelled = self._spell(ids)
        if spelled == want:
            return ids
        # SentencePiece's add_space_prefix turns "x" into "▁x": take that space back off.
        if spelled == b" " + want and self.tokens[ids[0]].startswith(b" "):
            head = self.tokens[ids[0]][1:]
            fixed = ids[1:] if not head else [self._id_of.get(head, -1), *ids[1:]]
            if -1 not in fixed and self._spell(fixed) == want:
                return fixed
        per_byte = [self._id_of.get(bytes([b]), -1) for b in want]
        return ids if -1 in per_byte else per_byte

    def _spell(self, ids: list[int]) -> bytes:
        return b"".join(self.tokens[i] for i in ids)


class GrammarTokenizer:
    """llguidance's view of one model's vocabulary, built once per model and cached."""

    def __init__(self, ll: llguidance.LLTokenizer, vocab_size: int, end_ids: frozenset[int]):
        self.ll = ll
        self.vocab_size = vocab_size
        self.end_ids = end_ids
        self.ends_only = np.zeros(vocab_size, dtype=bool)
        self.ends_only[[i for i in end_ids if i < vocab_size]] = True
        self.ends_only.flags.writeable = False

    @classmethod
    def for_tokenizer(cls, tok: Any) -> GrammarTokenizer:
        """The GrammarTokenizer of an `engine.text.tokenizer.Tokenizer`, cached on it."""
        cached = getattr(tok, _GRAMMAR_TOKENIZER_ATTR, None)
        if cached is not None:
            return cached
        with _build_lock:
            cached = getattr(tok, _GRAMMAR_TOKENIZER_ATTR, None)
            if cached is None:
                cached = cls._build(tok)
                setattr(tok, _GRAMMAR_TOKENIZER_ATTR, cached)
        return cached

    @classmethod
    def _build(cls, tok: Any) -> GrammarTokenizer:
        ends = frozenset(tok.end_of_turn_ids)
        types = getattr(tok, "_types", None)
        if types is not None:
            # Control pieces only: gemma's user-defined pieces ("\n", "  ", "<td>") are text.
            control = {i for i, k in enumerate(types) if k == TOKEN_CONTROL}
        else:
            control = set(tok.special_ids)
        special = sorted(control | ends | ({tok.bos_id} if tok.bos_id is not None else set()))
        eos = tok.eos_id if tok.eos_id is not None else min(ends, default=None)
        ll = llguidance.LLTokenizer(
            _VocabView(tok, special, eos),
            n_vocab=tok.vocab_size,
            eos_token=sorted(ends) if ends else None,
        )
        return cls(ll, tok.vocab_size, ends)

    def unpack(self, bitmask: np.ndarray) -> np.ndarray:
        """(B, words) int32 llguidance bitmask -> (B, vocab_size) bool, little bit order."""
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little").view(bool)
        if bits.shape[1] >= self.vocab_size:
            return bits[:, : self.vocab_size]
        out = np.zeros((bits.shape[0], self.vocab_size), dtype=bool)
        out[:, : bits.shape[1]] = bits
        return out


class Constraint:
    """One sequence's matcher: allowed() -> sample -> accept(token), until done."""

    def __init__(self, plan: ConstraintPlan, gtok: GrammarTokenizer):
        if plan.grammar is None:
            raise ValueError(f"a {plan.status!r} plan has no grammar to constrain with")
        self.gtok = gtok
        self._matcher = llguidance.LLMatcher(gtok.ll, plan.grammar, log_level=0)
        if self._matcher.is_error():
            raise ValueError(f"grammar rejected: {self._matcher.get_error()}")
        self._mask: np.ndarray | None = None

    def allowed(self) -> np.ndarray:
        """Bool (vocab_size,) mask of the tokens allowed next (read-only; cached until accept).

        Once the value is complete only the end-of-turn ids are allowed; a matcher that hit
        a resource limit also allows only them, so the sequence ends and fails validation."""
        if self._mask is None and not self._matcher.is_error():
            bitmask = llnp.allocate_token_bitmask(1, self.gtok.ll.vocab_size)
            llnp.fill_next_token_bitmask(self._matcher, bitmask)
            self._set_mask(self.gtok.unpack(bitmask)[0])
        if self._mask is None or self._matcher.is_error():
            return self.gtok.ends_only
        return self._mask

    def _set_mask(self, mask: np.ndarray) -> None:
        mask.flags.writeable = False
        self._mask = mask

    def accept(self, token_id: int) -> None:
        """Consume a sampled token; ValueError (matcher unchanged) if the grammar forbids it."""
        token_id = int(token_id)
        if not 0 <= token_id < self.gtok.ll.vocab_size:
            raise ValueError(f"token {token_id} is outside the grammar's vocabulary")
        # validate_tokens refuses an end token once the matcher has stopped; consume takes it.
        ends_value = token_id in self.gtok.end_ids and self._matcher.is_accepting()
        if not ends_value and self._matcher.validate_tokens([token_id]) != 1:
            raise ValueError(f"token {token_id} is not allowed here by the grammar")
        if not self._matcher.consume_token(token_id):
            raise ValueError(f"grammar error on token {token_id}: {self._matcher.get_error()}")
        self._mask = None

    @property
    def done(self) -> bool:
        """The value is complete and nothing more may follow: stop decoding."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The text so far is a complete value (an end token would be allowed)."""
        return self._matcher.is_accepting()

    @property
    def error(self) -> str:
        """llguidance's error (e.g. a parser resource limit), "" when healthy."""
        return self._matcher.get_error()


def fill_masks(constraints: list[Constraint | None]) -> list[np.ndarray | None]:
    """allowed() for a batch of sequences, the masks computed in parallel by llguidance."""
    global _executor
    groups: dict[int, list[Constraint]] = {}
    for c in constraints:
        if c is not None and c._mask is None and not c._matcher.is_error():
            groups.setdefault(id(c.gtok), []).append(c)
    if groups and _executor is None:
        with _build_lock:
            _executor = _executor or llguidance.LLExecutor()
    for group in groups.values():
        gtok = group[0].gtok
        bitmask = llnp.allocate_token_bitmask(len(group), gtok.ll.vocab_size)
        llnp.fill_next_token_bitmask_par(
            _executor, [(c._matcher, row) for row, c in enumerate(group)], bitmask
        )
        for c, mask in zip(group, gtok.unpack(bitmask), strict=True):
            c._set_mask(mask)
    return [None if c is None else c.allowed() for c in constraints]


def check_output_async(
    plan: ConstraintPlan, text: str, done: Callable[[OutputVerdict], None]
) -> None:
    """check_output on the validation pool (never the caller's thread: the engine's must
    not wait on a client's schema); `done(verdict)` is called from that pool."""
    global _validation_pool
    if _validation_pool is None:
        with _build_lock:
            if _validation_pool is None:
                _validation_pool = ThreadPoolExecutor(
                    max_workers=VALIDATION_WORKERS, thread_name_prefix="pantheon-validate"
                )

    def run() -> None:
        try:
            verdict = check_output(plan, text)
        except Exception as e:  # a jsonschema bug must still settle the choice
            log.exception("validating a response_format answer failed")
            verdict = OutputVerdict(False, f"the output could not be validated: {e}")
        done(verdict)

    _validation_pool.submit(run)
