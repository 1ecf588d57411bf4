"""The finished answer checked against its plan's schema, within a time bound: every
regular expression of a check runs in the `regex` engine with the time the check has
left, so a hostile schema cannot stall the process (see "bounded validation" below)."""

from __future__ import annotations

import functools
import json
import re
import re._constants as sre  # Python's own regex parser: sizes a pattern before compiling
import re._parser as sre_parser
import threading
import time
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema
import jsonschema._keywords
import jsonschema._legacy_keywords
import jsonschema._utils
import referencing
import referencing.exceptions
import regex
from jsonschema.exceptions import best_match

if TYPE_CHECKING:
    from engine.decoding.response_format import ConstraintPlan

# The final answer's schema check (validate_output): all of it within this time, on a pool
# of its own (check_output_async), never on the engine thread.
VALIDATION_TIMEOUT_S = 0.25


def _validator_class(schema: dict) -> type:
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


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


def validate_output(plan: ConstraintPlan, text: str) -> tuple[bool, str]:
    """(True, "") if `text` is JSON valid against plan.schema, else (False, why)."""
    verdict = check_output(plan, text)
    return verdict.ok, verdict.why


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
