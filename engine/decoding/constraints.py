"""Structured output: an OpenAI `response_format` -> an llguidance grammar -> token masks.

`plan_response_format` compiles a request's response_format once (no model needed);
`Constraint` is one sequence's matcher over one model's vocabulary (`GrammarTokenizer`);
`validate_output` checks the finished text against the schema, so a value cut short by
max_tokens, or a schema feature the grammar could not enforce, is reported, never passed
off as conformant.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import re._constants as sre  # Python's own regex parser: sizes a pattern before compiling
import re._parser as sre_parser
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jsonschema
import jsonschema._keywords
import jsonschema._legacy_keywords
import jsonschema._utils
import llguidance
import llguidance.numpy as llnp
import numpy as np
import referencing
import referencing.exceptions
import regex
from jsonschema.exceptions import best_match

from engine.text.tokenizer import TOKEN_CONTROL

JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}

# Each run of JSON whitespace is capped (llguidance matches the pattern once per place
# whitespace may go): room for pretty-printed output, but a model cannot loop on newlines.
WHITESPACE_PATTERN = r"[\x20\x0A\x0D\x09]{1,64}"
# "\u00f6" is as valid in a JSON string as "ö", and json.dumps-trained models write it.
_COMPILE_DEFAULTS = {
    "whitespace_pattern": WHITESPACE_PATTERN,
    "json_allow_general_unicode_escapes": True,
}
# A schema's own "x-guidance" may not switch on llguidance's silent approximations.
_STRICT = {"lenient": False, "coerce_one_of": False}
_LENIENT = {"lenient": True}

# The final answer's schema check (validate_output): all of it within this time, on a pool
# of its own (check_output_async), never on the engine thread.
VALIDATION_TIMEOUT_S = 0.25
VALIDATION_WORKERS = 2

log = logging.getLogger(__name__)

_GRAMMAR_TOKENIZER_ATTR = "_grammar_tokenizer"
_build_lock = threading.Lock()
_executor: llguidance.LLExecutor | None = None
_validation_pool: ThreadPoolExecutor | None = None


@dataclass(frozen=True)
class ConstraintPlan:
    """What a request's response_format compiles to, once per request.

    status: "applied" | "schema_downgraded" | "ignored_unknown_type" | "text".
    grammar: llguidance's top-level grammar (JSON text); None = unconstrained.
    schema: what the final content is validated against: the client's own schema (its
    objects closed, see closed_objects), also when downgraded (so a value breaking the
    dropped feature fails validation).
    """

    status: str
    message: str = ""
    grammar: str | None = None
    schema: dict | None = None


TEXT_PLAN = ConstraintPlan("text")


def _compile(schema: dict, overrides: dict) -> tuple[str, bool, list[str]]:
    """(grammar, is_error, llguidance's errors or warnings) for a JSON schema."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults=_COMPILE_DEFAULTS, overrides=overrides
    )
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return grammar, is_error, messages


def _validator_class(schema: dict) -> type:
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _type_only(schema: dict) -> dict:
    """The nearest always-enforceable schema: the root's declared type(s), else an object."""
    kind = schema.get("type")
    if isinstance(kind, str) and kind in JSON_TYPES:
        return {"type": kind}
    if isinstance(kind, list) and kind and all(k in JSON_TYPES for k in kind):
        return {"type": kind}
    return dict(JSON_OBJECT_SCHEMA)


# --- objects closed by default ---------------------------------------------------------
#
# An object schema that lists `properties` and says nothing of `additionalProperties` (or
# `unevaluatedProperties`) admits any other key by JSON Schema's letter, and a model held
# to it kept adding keys until `length`. Like llama.cpp and vLLM, the grammar and the
# final check read a missing `additionalProperties` as false, at every nesting level; an
# explicit value (true, a schema) is kept. Subschemas that describe one object together
# (an `allOf` of several parts, `anyOf`/`oneOf`/`$ref` beside `properties`) are closed as
# a whole: the object may hold the keys any of its parts names, and no other.

# ("not" is left as it is: closing what it negates would widen the schema.)
_SUBSCHEMA = ("additionalProperties", "unevaluatedProperties", "propertyNames", "if", "then")
_SUBSCHEMA += ("else", "contains", "additionalItems", "unevaluatedItems")
_SUBSCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPEN_KEYS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


def closed_objects(schema: Any) -> Any:
    """A copy of `schema` with `additionalProperties: false` on every object schema that
    lists `properties` and leaves additional ones unsaid (see above); `schema` itself is
    not changed."""
    if not isinstance(schema, dict):
        return schema
    keep_open: set[int] = set()  # ids of the parts of shared objects (nodes of `schema`)
    _mark_parts(schema, schema, keep_open, 0)
    return _close(schema, schema, keep_open)


def _resolve(root: dict, ref: str) -> Any:
    """The node a local `$ref` ("#/$defs/x") points to in `root`, else None."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for key in filter(None, ref[1:].split("/")):
        key = key.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return None
    return node


def _parts(root: dict, node: dict) -> list[Any]:
    """The subschemas that apply to the same instance as `node`'s own keywords (a `$ref`
    part also as the node it points to; None where that cannot be resolved)."""
    parts = [s for k in ("allOf", "anyOf", "oneOf") for s in _list(node.get(k))]
    parts += [node[k] for k in ("if", "then", "else") if k in node]
    dependent = node.get("dependentSchemas")
    parts += list(dependent.values()) if isinstance(dependent, dict) else []
    if isinstance(node.get("$ref"), str):
        parts.append(_resolve(root, node["$ref"]))
    for part in list(parts):
        if isinstance(part, dict) and part is not node and isinstance(part.get("$ref"), str):
            parts.append(_resolve(root, part["$ref"]))
    return parts


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _shared(node: dict) -> bool:
    """`node` and its parts describe one object together (else a lone anyOf's or oneOf's
    branches are each an object of its own)."""
    together = len(_list(node.get("allOf"))) + isinstance(node.get("$ref"), str)
    together += sum(k in node for k in ("anyOf", "oneOf", "if", "dependentSchemas"))
    return isinstance(node.get("properties"), dict) or together >= 2


def _keep(root: dict, part: Any, keep_open: set[int], depth: int) -> None:
    if not isinstance(part, dict) or id(part) in keep_open or depth > 64:
        return
    keep_open.add(id(part))
    for sub in _parts(root, part):  # a part's own parts describe the same object too
        _keep(root, sub, keep_open, depth + 1)


def _mark_parts(root: dict, node: Any, keep_open: set[int], depth: int) -> None:
    """Put the ids of the subschemas that are parts of a shared object in `keep_open`."""
    if depth > 64:
        return
    if isinstance(node, dict):
        if _shared(node):
            for part in _parts(root, node):
                _keep(root, part, keep_open, 0)
        node = list(node.values())
    if isinstance(node, list):
        for item in node:
            if isinstance(item, dict | list):
                _mark_parts(root, item, keep_open, depth + 1)


def _names(root: dict, part: Any, depth: int = 0) -> set[str] | None:
    """The property names a part of a shared object lists; None when it admits others."""
    if isinstance(part, bool):
        return set()
    if not isinstance(part, dict) or depth > 32:
        return None
    if any(part.get(k) not in (None, False) for k in _OPEN_KEYS):
        return None
    names = set(part.get("properties") or {})
    for sub in _parts(root, part):
        more = _names(root, sub, depth + 1)
        if more is None:
            return None
        names |= more
    return names


def _close(root: dict, node: Any, keep_open: set[int]) -> Any:
    if isinstance(node, list):
        return [_close(root, item, keep_open) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _SUBSCHEMAS and isinstance(value, dict):
            out[key] = {k: _close(root, v, keep_open) for k, v in value.items()}
        elif key in _SUBSCHEMA or key in ("items", "prefixItems", "allOf", "anyOf", "oneOf"):
            out[key] = _close(root, value, keep_open)
        else:
            out[key] = value
    unsaid = "additionalProperties" not in node and "unevaluatedProperties" not in node
    if not unsaid or id(node) in keep_open:
        return out
    if not _shared(node):
        if isinstance(node.get("properties"), dict):
            out["additionalProperties"] = False
        return out
    names: set[str] | None = set(node.get("properties") or {})
    for part in _parts(root, node):
        more = _names(root, part)
        names = None if more is None or names is None else names | more
    if names is not None:
        own = out.get("properties") if isinstance(out.get("properties"), dict) else {}
        out["properties"] = {**{n: {} for n in sorted(names - set(own))}, **own}
        out["additionalProperties"] = False
    return out


def _plan_json_schema(spec: Any) -> ConstraintPlan:
    if not isinstance(spec, dict):
        raise ValueError("response_format.json_schema must be an object")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise ValueError("response_format.json_schema.schema must be a JSON schema object")
    if "name" in spec and not isinstance(spec["name"], str):
        raise ValueError("response_format.json_schema.name must be a string")
    if "strict" in spec and not isinstance(spec["strict"], bool | None):
        raise ValueError("response_format.json_schema.strict must be a boolean")
    try:
        _validator_class(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        message = f"response_format.json_schema.schema is invalid at {where}: {e.message}"
        raise ValueError(message) from None

    schema = closed_objects(schema)
    grammar, is_error, messages = _compile(schema, _STRICT)
    if not is_error and not messages:
        return ConstraintPlan("applied", grammar=grammar, schema=schema)
    if not is_error:  # compiled, but llguidance warns it approximates something
        return ConstraintPlan(
            "schema_downgraded", _downgrade_message(messages), grammar=grammar, schema=schema
        )
    # Lenient mode drops the keywords llguidance cannot express and names each one.
    grammar, is_error, lenient_messages = _compile(schema, _LENIENT)
    if not is_error:
        return ConstraintPlan(
            "schema_downgraded",
            _downgrade_message(lenient_messages or messages),
            grammar=grammar,
            schema=schema,
        )
    fallback = _type_only(schema)
    grammar, is_error, _ = _compile(fallback, _STRICT)
    if is_error:  # cannot happen for a bare type; never hand out a grammar that fails
        raise RuntimeError(f"llguidance cannot compile {fallback}")
    message = (
        f"{_downgrade_message(lenient_messages or messages)}; enforcing only {json.dumps(fallback)}"
    )
    return ConstraintPlan("schema_downgraded", message, grammar=grammar, schema=schema)


def _downgrade_message(messages: list[str]) -> str:
    return "schema feature not enforced: " + "; ".join(m.strip() for m in messages)


_JSON_OBJECT_PLAN: ConstraintPlan | None = None


def plan_response_format(response_format: dict | None) -> ConstraintPlan:
    """Compile an OpenAI response_format. Raises ValueError for a malformed one (a 400)."""
    global _JSON_OBJECT_PLAN
    if response_format is None:
        return TEXT_PLAN
    if not isinstance(response_format, dict):
        raise ValueError("response_format must be an object")
    kind = response_format.get("type")
    if not isinstance(kind, str):
        raise ValueError("response_format.type is required and must be a string")
    if kind == "text":
        return TEXT_PLAN
    if kind == "json_object":
        if _JSON_OBJECT_PLAN is None:
            grammar, _, _ = _compile(JSON_OBJECT_SCHEMA, _STRICT)
            _JSON_OBJECT_PLAN = ConstraintPlan(
                "applied", grammar=grammar, schema=JSON_OBJECT_SCHEMA
            )
        return _JSON_OBJECT_PLAN
    if kind == "json_schema":
        return _plan_json_schema(response_format.get("json_schema"))
    return ConstraintPlan(
        "ignored_unknown_type", f"response_format type {kind!r} is not supported; not enforced"
    )


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


def validate_output(plan: ConstraintPlan, text: str) -> tuple[bool, str]:
    """(True, "") if `text` is JSON valid against plan.schema, else (False, why)."""
    verdict = check_output(plan, text)
    return verdict.ok, verdict.why


@dataclass(frozen=True)
class OutputVerdict:
    ok: bool
    why: str = ""
    timed_out: bool = False  # the check could not finish (out of time, or a pattern too
    # large to compile): the answer is not known to be valid


def check_output(
    plan: ConstraintPlan, text: str, timeout_s: float = VALIDATION_TIMEOUT_S
) -> OutputVerdict:
    """`text` checked against plan.schema within `timeout_s` (the whole check: every
    keyword and every regular expression in it). Safe on any thread: the schema's
    patterns run in the `regex` engine, which lets go of the GIL while it matches, with
    a timeout; a check past its time is reported (timed_out), never waited out."""
    if plan.schema is None:
        return OutputVerdict(True)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return OutputVerdict(False, f"output is not valid JSON: {e}")
    except RecursionError:
        return OutputVerdict(False, "output is nested too deeply to validate")
    cls, formats = _bounded_validator(_validator_class(plan.schema))
    # An empty registry: a remote $ref is unresolvable here, never fetched.
    validator = cls(plan.schema, registry=referencing.Registry(), format_checker=formats)
    previous = getattr(_clock, "deadline", None)
    _clock.deadline = time.monotonic() + timeout_s
    try:
        error = best_match(validator.iter_errors(value))
    except ValidationTimeout as e:
        return OutputVerdict(False, str(e), True)
    except referencing.exceptions.Unresolvable as e:
        return OutputVerdict(False, f"schema reference cannot be resolved: {e}")
    except RecursionError:
        return OutputVerdict(False, "output is nested too deeply to validate")
    except regex.error as e:
        return OutputVerdict(False, f"a pattern of the schema cannot be compiled: {e}")
    finally:
        _clock.deadline = previous
    if error is None:
        return OutputVerdict(True)
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return OutputVerdict(False, f"output does not match the schema at {where}: {error.message}")


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


# --- bounded validation -------------------------------------------------------------
#
# jsonschema matches `pattern`, `patternProperties` (also inside additionalProperties and
# unevaluatedProperties) with Python's `re`, which backtracks without bound while holding
# the GIL: one hostile pattern froze every thread for seconds. Here every regular
# expression of a check goes through `regex` (the same syntax as `re`) with the time the
# check has left, the `regex` format is checked the same way, each keyword looks at the
# deadline before it runs, and uniqueItems is linear.


class ValidationTimeout(Exception):
    """A schema check that cannot finish: past its deadline, or a pattern too large to
    compile. The message says which."""


_clock = threading.local()  # .deadline: time.monotonic() by which the check must end


def _time_left() -> float | None:
    deadline = getattr(_clock, "deadline", None)
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise ValidationTimeout(
            f"the schema check timed out: it took longer than {VALIDATION_TIMEOUT_S:g} s"
        )
    return left


# A pattern whose repeats, counted out, pass this many positions is not compiled: the
# `regex` engine unrolls counted repeats, so `(?:a{1000}){1000}` takes it half a second
# and a third level minutes (its timeout bounds matching, not compiling).
MAX_PATTERN_POSITIONS = 100_000
_CACHED_PATTERN_CHARS = 4096  # longer patterns are compiled per check, not kept


def _compiled(pattern: str) -> regex.Pattern:
    if len(pattern) <= _CACHED_PATTERN_CHARS:
        return _compiled_cached(pattern)
    return _compile_pattern(pattern)


@functools.lru_cache(maxsize=256)
def _compiled_cached(pattern: str) -> regex.Pattern:
    return _compile_pattern(pattern)


def _compile_pattern(pattern: str) -> regex.Pattern:
    if _positions(pattern) > MAX_PATTERN_POSITIONS:
        raise ValidationTimeout(
            f"the schema check could not finish: pattern {_shorten(pattern)!r} is too "
            f"large to check (over {MAX_PATTERN_POSITIONS} positions once its repeats "
            "are counted)"
        )
    return regex.compile(pattern)


_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


def _positions(pattern: str) -> int:
    """How many positions `pattern` spans with its counted repeats unrolled (capped just
    past MAX_PATTERN_POSITIONS), from Python's own parse of it; a pattern Python cannot
    parse counts as its length (`regex` compiles what it can of it, or refuses it)."""
    try:
        parsed = sre_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return len(pattern)

    def size(items) -> int:
        total = 0
        for op, av in items:
            if op in _REPEATS:
                low, high, sub = av
                total += max(1, low if high == sre.MAXREPEAT else high) * size(sub)
            elif op is sre.SUBPATTERN:
                total += size(av[-1])
            elif op is sre.BRANCH:
                total += sum(size(branch) for branch in av[1])
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                total += size(av[1])
            elif op is sre.ATOMIC_GROUP:
                total += size(av)
            elif op is sre.GROUPREF_EXISTS:
                total += size(av[1]) + (size(av[2]) if av[2] else 0)
            else:
                total += 1
            if total > MAX_PATTERN_POSITIONS:
                return MAX_PATTERN_POSITIONS + 1
        return total

    try:
        return size(parsed.data)
    except RecursionError:
        return MAX_PATTERN_POSITIONS + 1


def bounded_search(pattern: str, string: str) -> regex.Match | None:
    """`re.search(pattern, string)` within the current check's time (unbounded outside a
    check). Raises ValidationTimeout, or regex.error for a pattern it cannot compile."""
    compiled = _compiled(pattern)
    left = _time_left()
    try:
        return compiled.search(string, timeout=left)
    except TimeoutError:
        raise ValidationTimeout(
            f"the schema check timed out: pattern {_shorten(pattern)!r} took longer than "
            f"{VALIDATION_TIMEOUT_S:g} s to match"
        ) from None


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


class _BoundedRe(types.ModuleType):
    """What jsonschema's keyword modules see as `re`: `search` is bounded_search; the
    rest is the standard module."""

    def __init__(self):
        super().__init__("re")

    def __getattr__(self, name: str):
        return getattr(re, name)

    @staticmethod
    def search(pattern, string, flags=0):
        if flags or not isinstance(pattern, str) or not isinstance(string, str):
            return re.search(pattern, string, flags)
        return bounded_search(pattern, string)


# Every jsonschema module that calls re.search on a schema's patterns (a test checks that
# no other one does).
_REGEX_USERS = (jsonschema._keywords, jsonschema._utils, jsonschema._legacy_keywords)
for _module in _REGEX_USERS:
    _module.re = _BoundedRe()


def _is_regex(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    try:
        _compiled(instance)
    except (RecursionError, OverflowError, ValueError) as e:
        raise regex.error(str(e)) from None
    return True


def _canonical(value: Any) -> Any:
    """A hashable form under JSON Schema equality (1 == 1.0, true != 1, key order free)."""
    if isinstance(value, bool) or value is None:
        return ("c", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("l", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("d", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("o", repr(value))


def _unique_items(validator, unique, instance, schema):
    """jsonschema's uniqueItems, in linear time (its fallback compares every pair)."""
    if unique and validator.is_type(instance, "array"):
        seen = set()
        for item in instance:
            key = _canonical(item)
            if key in seen:
                yield jsonschema.ValidationError(f"{instance!r} has non-unique elements")
                return
            seen.add(key)


def _bounded(keyword):
    def check(validator, value, instance, schema):
        _time_left()
        return keyword(validator, value, instance, schema)

    return check


@functools.cache
def _bounded_validator(cls: type) -> tuple[type, jsonschema.FormatChecker]:
    """`cls` whose every keyword first checks the deadline, and its draft's formats with
    `regex` compiled by the `regex` engine."""
    keywords = {name: _bounded(fn) for name, fn in cls.VALIDATORS.items()}
    if "uniqueItems" in keywords:
        keywords["uniqueItems"] = _bounded(_unique_items)
    formats = jsonschema.FormatChecker(formats=())
    formats.checkers = {**cls.FORMAT_CHECKER.checkers, "regex": (_is_regex, regex.error)}
    return jsonschema.validators.extend(cls, keywords), formats
