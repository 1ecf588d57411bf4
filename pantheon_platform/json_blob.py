"""A JSON body with one huge base64 string field, read in chunks and decoded as it streams.

A session restore is `{"session_id", "tokens", "blob": "<base64 of every KV byte>"}`:
hundreds of MB. Parsing it whole holds the body, a str of it and the decoded bytes at
once (~3.5x the blob) and does so in single calls that keep the GIL for seconds, stalling
every other request. `split_field` instead reads the body a chunk at a time, copies all
of it except the field's string value into a small `rest` (the value becomes "") that the
ordinary strict parser then checks, and hands the value's bytes to a sink as they arrive;
`Base64Sink` validates and decodes them a chunk at a time. Memory: the decoded blob plus
one chunk. The scan is linear (regex searches for single characters, no backtracking).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable

CHUNK_BYTES = 1 << 20
REST_MAX_BYTES = 16 << 20  # everything but the streamed field (a full window's token ids)
_STRUCTURE = re.compile(rb'[{}\[\]",:]')
_IN_STRING = re.compile(rb'["\\]')
_WHITESPACE = b" \t\r\n"
_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


class BodyTooLarge(ValueError):
    """More than `limit` bytes (`outside_field` False), or more than REST_MAX_BYTES outside
    the streamed field (True)."""

    def __init__(self, outside_field: bool):
        super().__init__(outside_field)
        self.outside_field = outside_field


class Base64Sink:
    """Decodes base64 handed over in arbitrary pieces; strict as b64decode(validate=True):
    only the alphabet, padding only at the end, a length that is a multiple of 4. A bad
    piece is remembered (`error`), not raised, so the caller reports it in its own order."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.error: str | None = None
        self.used = False
        self._carry = b""
        self._padding = 0

    def feed(self, piece: bytes) -> None:
        self.used = True
        if self.error is not None or not piece:
            return
        pad_at = piece.find(b"=")
        body, tail = (piece, b"") if pad_at < 0 else (piece[:pad_at], piece[pad_at:])
        if (self._padding and body) or body.translate(None, _BASE64):
            return self._fail()  # a non-alphabet byte, or data after the padding
        if tail:
            if tail.strip(b"=") or self._padding + len(tail) > 2:
                return self._fail()
            self._padding += len(tail)
        data = self._carry + piece
        whole = len(data) // 4 * 4
        try:
            self.out += binascii.a2b_base64(data[:whole])
        except binascii.Error:
            return self._fail()
        self._carry = data[whole:]

    def fail(self) -> None:
        """The value held something that is not base64 (e.g. a JSON escape)."""
        self.used = True
        self._fail()

    def finish(self) -> bytearray:
        """The decoded bytes; ValueError when the value was not base64."""
        if self._carry and self.error is None:
            self._fail()
        if self.error is not None:
            raise ValueError(self.error)
        return self.out

    def _fail(self) -> None:
        self.error = "not valid base64"
        self.out = bytearray()


def split_field(
    read: Callable[[int], bytes],
    field: bytes,
    limit: int,
    sink: Callable[[bytes], None],
    fail: Callable[[], None],
) -> bytes:
    """The body read through `read(n)` with the top-level string value of `field` emptied;
    that value's bytes go to `sink` as they arrive. A value holding a backslash escape calls
    `fail` (base64 has none). Malformed JSON passes through into the result, where the
    strict parser refuses it. Raises BodyTooLarge past `limit` bytes."""
    scan = _Scanner(field, sink, fail)
    total = 0
    while True:
        chunk = read(CHUNK_BYTES)
        if not chunk:
            return bytes(scan.rest)
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(outside_field=False)
        scan.feed(chunk)
        if len(scan.rest) > REST_MAX_BYTES:
            raise BodyTooLarge(outside_field=True)


class _Scanner:
    """Tracks just enough JSON structure to know when a string is the value of `field`
    in the outermost object: depth, whether a string is open (and escaped), whether the
    next string at depth 1 is a key, the key just read, and whether `"field":` was just
    seen (`armed`: its value starts at the next non-blank byte)."""

    def __init__(self, field: bytes, sink: Callable[[bytes], None], fail: Callable[[], None]):
        self.field, self.sink, self.fail = field, sink, fail
        self.rest = bytearray()
        self.depth = 0
        self.in_string = self.escaped = False
        self.streaming = False  # inside the field's value: bytes go to the sink
        self.discarding = False  # a value not kept in `rest` (escaped, or given twice)
        self.key_next = False  # the next string at depth 1 is a key
        self.key: bytearray | None = None  # the key being read
        self.last_key: bytes | None = None  # read, its colon not yet
        self.armed = False
        self.seen = False

    def feed(self, buf: bytes) -> None:
        pos, end = 0, len(buf)
        while pos < end:
            if self.streaming:
                pos = self._stream(buf, pos)
            elif self.in_string:
                pos = self._string(buf, pos)
            else:
                pos = self._structure(buf, pos)

    def _stream(self, buf: bytes, pos: int) -> int:
        quote = buf.find(b'"', pos)
        stop = len(buf) if quote < 0 else quote
        slash = buf.find(b"\\", pos, stop)
        if slash >= 0:  # an escape: not base64. The rest of the value is kept as an
            self.sink(buf[pos:slash])  # ordinary string, so the strict parser still
            self.fail()  # checks it (a lone surrogate there is a 400 naming `blob`)
            self.streaming, self.in_string = False, True
            return slash
        self.sink(buf[pos:stop])
        if quote < 0:
            return stop
        self.streaming = False
        self.rest += b'"'
        return quote + 1

    def _string(self, buf: bytes, pos: int) -> int:
        if self.escaped:  # the byte after a backslash, whatever it is
            self._keep(buf[pos : pos + 1])
            self.escaped = False
            return pos + 1
        match = _IN_STRING.search(buf, pos)
        if match is None:
            self._keep(buf[pos:])
            return len(buf)
        stop = match.end()
        if buf[match.start()] == 0x5C:  # a backslash: the next byte is escaped
            self._keep(buf[pos:stop])
            self.escaped = True
            return stop
        self._keep(buf[pos : stop - 1])
        self.in_string, self.discarding = False, False
        self.rest += b'"'
        if self.key is not None:
            self.last_key, self.key = bytes(self.key), None
        return stop

    def _keep(self, piece: bytes) -> None:
        if self.discarding:
            return
        self.rest += piece
        if self.key is not None:
            self.key += piece

    def _structure(self, buf: bytes, pos: int) -> int:
        match = _STRUCTURE.search(buf, pos)
        stop = len(buf) if match is None else match.start()
        gap = buf[pos:stop]
        self.rest += gap
        if gap.strip(_WHITESPACE):
            self.armed = False
            self.last_key = None
        if match is None:
            return stop
        char = buf[stop : stop + 1]
        self.rest += char
        armed, self.armed = self.armed, False
        if char in (b"{", b"["):
            self.depth += 1
            self.key_next = char == b"{" and self.depth == 1
        elif char in (b"}", b"]"):
            self.depth -= 1
        elif char == b"," and self.depth == 1:
            self.key_next = True
        elif char == b":" and self.depth == 1:
            self.armed = self.last_key == self.field
        elif char == b'"':
            self.in_string = True
            if self.depth == 1 and self.key_next:
                self.key_next, self.key = False, bytearray()
            elif armed and self.seen:  # the field twice: ambiguous, refused as not base64
                self.fail()
                self.discarding = True
            elif armed:
                self.seen, self.streaming, self.in_string = True, True, False
        self.last_key = None
        return stop + 1
