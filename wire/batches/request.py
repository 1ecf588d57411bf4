"""What POST /v1/batches says: `input_file_id`, `endpoint`, `completion_window`,
`metadata` (OpenAI's: at most 16 pairs, keys to 64 characters, values to 512). Bad
input is a 400 naming the field."""

from __future__ import annotations

from dataclasses import dataclass

from pantheon_platform.errors import invalid_request
from wire.batches.store import WINDOWS

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
KNOWN = {"input_file_id", "endpoint", "completion_window", "metadata"}


@dataclass(frozen=True)
class BatchRequest:
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict | None


def parse_request(body: dict) -> BatchRequest:
    for name in body:
        if name not in KNOWN:
            raise invalid_request(f"{name}: unknown field", param=name)
    input_file_id = body.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise invalid_request("input_file_id: expected a file id", param="input_file_id")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise invalid_request(f"endpoint: expected one of {list(ENDPOINTS)}", param="endpoint")
    window = body.get("completion_window")
    if window not in WINDOWS:
        raise invalid_request(
            f"completion_window: expected one of {list(WINDOWS)}", param="completion_window"
        )
    metadata = body.get("metadata")
    if metadata is not None and not _valid_metadata(metadata):
        raise invalid_request(
            "metadata: at most 16 string pairs, keys up to 64 characters, values up to 512",
            param="metadata",
        )
    return BatchRequest(input_file_id, endpoint, window, metadata)


def _valid_metadata(metadata) -> bool:
    return (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in metadata.items()
        )
    )
