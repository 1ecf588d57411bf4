"""pantheon_platform/json_blob.py: a restore body's blob decoded as it streams, the rest
of the body parsed as before, whatever the chunk boundaries."""

from __future__ import annotations

import base64
import io
import json
import random

import pytest

from pantheon_platform import json_blob
from pantheon_platform.json_blob import Base64Sink, BodyTooLarge, split_field


def split(body: bytes, chunk: int, limit: int = 1 << 30, monkeypatch=None):
    monkeypatch.setattr(json_blob, "CHUNK_BYTES", chunk)
    sink = Base64Sink()
    rest = split_field(io.BytesIO(body).read, b"blob", limit, sink.feed, sink.fail)
    return json.loads(rest), sink


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 4096])
def test_the_blob_round_trips_and_the_rest_parses_as_before(chunk, monkeypatch):
    rng = random.Random(chunk)
    for size in [0, 1, 2, 3, 4, 5, 99, 200]:
        blob = rng.randbytes(size)
        doc = {
            "session_id": 'a"b\\c',
            "nested": {"blob": "kept"},
            "blob": base64.b64encode(blob).decode(),
            "tokens": [1, 2, 3],
        }
        for indent in (None, 2):
            rest, sink = split(
                json.dumps(doc, indent=indent).encode(), chunk, monkeypatch=monkeypatch
            )
            assert rest == {**doc, "blob": ""}
            assert sink.used and bytes(sink.finish()) == blob


@pytest.mark.parametrize("value", ['"abc"', '"AA==AAAA"', '"A==="', '"AAA"', '"AA!A"', '"AA=A"'])
@pytest.mark.parametrize("chunk", [1, 2, 3, 50])
def test_what_b64decode_refuses_is_refused_and_the_rest_still_parses(value, chunk, monkeypatch):
    body = b'{"blob": ' + value.encode() + b', "k": 1}'
    rest, sink = split(body, chunk, monkeypatch=monkeypatch)
    assert rest == {"blob": "", "k": 1}
    with pytest.raises(ValueError):
        base64.b64decode(json.loads(body)["blob"], validate=True)
    with pytest.raises(ValueError, match="not valid base64"):
        sink.finish()


def test_values_that_are_not_a_top_level_string_pass_through(monkeypatch):
    for body in (b'{"blob": 12, "b": "blob"}', b'[{"blob": "AAAA"}]', b'{"x": {"blob": "AA"}}'):
        rest, sink = split(body, 2, monkeypatch=monkeypatch)
        assert rest == json.loads(body) and not sink.used


def test_an_escaped_blob_is_refused(monkeypatch):
    """b64decode would take "ab\\u0041c" (JSON's escape of "abAc"); base64 never needs an
    escape, and refusing one keeps the scan a byte search."""
    rest, sink = split(b'{"blob": "ab\\u0041c", "k": 1}', 3, monkeypatch=monkeypatch)
    assert rest == {"blob": "Ac", "k": 1}  # from the escape on: kept for the strict parser
    with pytest.raises(ValueError):
        sink.finish()


def test_the_field_given_twice_is_refused(monkeypatch):
    rest, sink = split(b'{"blob": "AAAA", "blob": "BBBB"}', 2, monkeypatch=monkeypatch)
    with pytest.raises(ValueError):
        sink.finish()


def test_malformed_json_stays_malformed(monkeypatch):
    monkeypatch.setattr(json_blob, "CHUNK_BYTES", 2)
    sink = Base64Sink()
    rest = split_field(
        io.BytesIO(b'{not json "blob": "AAAA"}').read, b"blob", 1 << 20, sink.feed, sink.fail
    )
    with pytest.raises(ValueError):
        json.loads(rest)


def test_the_limits(monkeypatch):
    with pytest.raises(BodyTooLarge) as info:
        split(b'{"blob": "AAAAAAAA"}', 4, limit=10, monkeypatch=monkeypatch)
    assert not info.value.outside_field
    monkeypatch.setattr(json_blob, "REST_MAX_BYTES", 16)
    with pytest.raises(BodyTooLarge) as info:
        split(b'{"blob": "AAAAAAAAAAAAAAAA", "pad": "xxxxxxxxxxx"}', 4, monkeypatch=monkeypatch)
    assert info.value.outside_field
    rest, sink = split(b'{"blob": "AAAAAAAAAAAAAAAAAAAA"}', 4, monkeypatch=monkeypatch)
    assert bytes(sink.finish()) == bytes(15)
