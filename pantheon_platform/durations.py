"""Go duration strings ("5m", "1h30m", "-1", "0.5h"), as Ollama's `keep_alive` takes them,
read by a single left-to-right scan.

Never a regular expression: a backtracking pattern over a client's string runs under the
GIL on the event loop's thread, and `"1" * 32000 + "!"` froze the whole process for 46 s.
This reader looks at each character once and refuses anything longer than
DURATION_MAX_CHARS before looking at all.
"""

from __future__ import annotations

DURATION_MAX_CHARS = 64  # "1h2m3s4ms5us6ns" is 15; a longer string is not a duration
UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DIGITS = frozenset("0123456789")


def _number(text: str, at: int) -> tuple[str, int]:
    """The decimal number at `at` ("12", "1.5", "1.", ".5") and where it ends; "" when
    there is none."""
    end = at
    while end < len(text) and text[end] in _DIGITS:
        end += 1
    whole = end > at
    if end < len(text) and text[end] == ".":
        frac_start = end + 1
        end = frac_start
        while end < len(text) and text[end] in _DIGITS:
            end += 1
        if not whole and end == frac_start:
            return "", at  # a lone "."
    return text[at:end], end


def _unit(text: str, at: int) -> tuple[str, int]:
    """The unit at `at` (longest first: "ms" before "m") and where it ends; "" when none."""
    for width in (2, 1):
        unit = text[at : at + width]
        if len(unit) == width and unit in UNIT_SECONDS:
            return unit, at + width
    return "", at


def parse_duration(value: str) -> float | None:
    """Seconds for a Go duration (a bare number is seconds, as Ollama reads "-1"), signed;
    None when `value` is not one. Surrounding whitespace is allowed."""
    if len(value) > DURATION_MAX_CHARS:
        return None
    text = value.strip()
    sign = 1.0
    if text[:1] in ("+", "-"):
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    total, at, parts = 0.0, 0, 0
    while at < len(text):
        number, at = _number(text, at)
        if not number:
            return None
        unit, at = _unit(text, at)
        if not unit and (parts > 0 or at < len(text)):
            return None  # only a lone number may go without a unit: "1h30" is not one
        total += float(number) * UNIT_SECONDS[unit or "s"]
        parts += 1
    if parts == 0:
        return None
    return sign * total
