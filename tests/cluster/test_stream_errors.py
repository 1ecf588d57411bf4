"""How the router ends a stream its instance broke off, per wire format
(cluster/stream_errors.py): the event each format's clients parse as a failure."""

from __future__ import annotations

import json

from cluster.stream_errors import StreamTail

SSE = "text/event-stream; charset=utf-8"


def events(raw: bytes) -> list[tuple[str | None, dict | str]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = line.removeprefix("data: ")
                out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


def test_openai_streams_end_in_an_error_chunk():
    for path in ("/v1/chat/completions", "/v1/completions"):
        tail = StreamTail(path, SSE)
        tail.saw(b'data: {"id":"x"}\n\n')
        ((name, data),) = events(tail.failure("gone"))
        assert name is None and data["error"]["type"] == "instance_failed"


def test_anthropic_streams_end_in_an_error_event_of_its_shape():
    tail = StreamTail("/v1/messages", SSE)
    tail.saw(b'event: content_block_delta\ndata: {"type":"content_block_delta"')  # cut
    raw = tail.failure("gone")
    assert raw.startswith(b"\n\n")  # the cut event is closed first
    name, data = events(raw)[-1]
    assert name == "error"
    assert data == {"type": "error", "error": {"type": "api_error", "message": "gone"}}


def test_responses_streams_end_in_error_then_response_failed():
    tail = StreamTail("/v1/responses", SSE)
    tail.saw(
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
        b'"response":{"id":"resp_ab12","status":"in_progress"}}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"sequence_number":7,"delta":"Hi"}\n\n'
    )
    (error_name, error), (failed_name, failed) = events(tail.failure("gone"))
    assert error_name == error["type"] == "error" and error["sequence_number"] == 8
    assert failed_name == failed["type"] == "response.failed"
    assert failed["sequence_number"] == 9
    assert failed["response"]["id"] == "resp_ab12"
    assert failed["response"]["status"] == "failed"


def test_ollama_streams_end_in_an_error_line():
    tail = StreamTail("/api/chat", "application/x-ndjson")
    tail.saw(b'{"message":{"content":"1"},"done":false}\n{"message":')
    raw = tail.failure("gone")
    assert raw.startswith(b"\n") and raw.endswith(b"\n")
    assert json.loads(raw.strip()) == {"error": "gone"}


def test_a_cut_json_answer_gets_nothing_appended():
    assert StreamTail("/v1/chat/completions", "application/json").failure("gone") == b""
