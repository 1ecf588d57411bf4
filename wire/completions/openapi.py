"""The OpenAPI pieces of wire/completions's routes: POST /v1/completions (OpenAI's legacy
completions), POST /v1/embeddings, and llama.cpp's POST /tokenize and POST /detokenize.
The bounds are the validators' own constants.

pantheon_site/openapi.py calls add_paths() with its paths and merges schemas()."""

from __future__ import annotations

from engine import MAX_CHOICES, MAX_TOKENS_CLAMP
from pantheon_platform.openapi import (
    BOOL,
    FINITE,
    INT64,
    JSON,
    NON_NEGATIVE,
    NUMBER,
    SSE,
    STRING,
    field_schema,
    sse_event,
)
from pantheon_platform.openapi import nullable as _nullable
from pantheon_platform.openapi import obj as _object
from pantheon_platform.openapi import ok as _ok
from pantheon_platform.openapi import operation as _operation
from pantheon_platform.openapi import ref as _ref
from pantheon_platform.openapi import session_header as _session_header
from pantheon_platform.strict_json import (
    IDENTIFIER_MAX,
    MAX_LOGIT_BIAS,
    MAX_STOP_STRINGS,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_RANGE,
    SpeculationField,
)
from wire.completions.common import TOKEN_ID_MAX
from wire.completions.embeddings import ENCODINGS, MAX_INPUTS, MAX_TOTAL_TOKENS
from wire.completions.request import DEFAULT_MAX_TOKENS, MAX_LOGPROBS, MAX_PROMPTS

_TOKEN_ID = {"type": "integer", "minimum": 0, "maximum": TOKEN_ID_MAX}


def _inputs(what: str, limit: int, min_length: int = 0) -> dict:
    """OpenAI's input forms: a string, strings, token ids, or arrays of token ids."""
    ids = {"type": "array", "minItems": 1, "items": _TOKEN_ID}
    text = {"type": "string", "minLength": min_length}
    return {
        "anyOf": [
            text,
            {"type": "array", "minItems": 1, "maxItems": limit, "items": text},
            ids,
            {"type": "array", "minItems": 1, "maxItems": limit, "items": ids},
        ],
        "description": f"A string, an array of at most {limit} strings, an array of token "
        f"ids, or an array of at most {limit} arrays of token ids ({what}). An id outside "
        "the model's vocabulary is a 400.",
    }


def schemas() -> dict:
    model = _nullable(
        {
            "type": "string",
            "maxLength": IDENTIFIER_MAX,
            "description": "Served name or alias; with one model loaded any value (or none) "
            "routes to it.",
        }
    )
    completion_request = _object(
        {
            "model": model,
            "prompt": _inputs("one request per prompt", MAX_PROMPTS),
            "suffix": _nullable(
                {
                    "const": "",
                    "description": "Not supported: any value but null or an empty string is a 400.",
                }
            ),
            "max_tokens": _nullable(
                {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": INT64["maximum"],
                    "description": f"Default {DEFAULT_MAX_TOKENS}; clamped to "
                    f"{MAX_TOKENS_CLAMP}. 0 generates nothing (with echo and logprobs: the "
                    "prompt's log-likelihood).",
                }
            ),
            "temperature": _nullable(
                {
                    "type": "number",
                    "minimum": TEMPERATURE_RANGE[0],
                    "maximum": TEMPERATURE_RANGE[1],
                    "description": "Default 0.7; <= 0 is greedy.",
                }
            ),
            "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
            "top_k": _nullable(
                {"type": "integer", "minimum": -(1 << 31), "maximum": (1 << 31) - 1}
            ),
            "min_p": _nullable({**FINITE, "description": "Clamped to [0, 1]."}),
            "n": _nullable(
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_CHOICES,
                    "description": "Per prompt.",
                }
            ),
            "best_of": _nullable(
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_CHOICES,
                    "description": "Not supported unless equal to n (else a 400).",
                }
            ),
            "stream": _nullable(BOOL),
            "stream_options": _nullable(_object({"include_usage": _nullable(BOOL)})),
            "logprobs": _nullable(
                {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_LOGPROBS,
                    "description": "Log-probabilities of each token and of this many likely "
                    "alternatives.",
                }
            ),
            "echo": _nullable(
                {**BOOL, "description": "Prepend the prompt (and, with logprobs, score it)."}
            ),
            "stop": _nullable(
                {
                    "anyOf": [
                        {"type": "string", "maxLength": IDENTIFIER_MAX},
                        {
                            "type": "array",
                            "maxItems": MAX_STOP_STRINGS,
                            "items": {"type": "string", "maxLength": IDENTIFIER_MAX},
                        },
                    ]
                }
            ),
            "seed": _nullable(INT64),
            "presence_penalty": _nullable({**FINITE, "description": "Clamped to [-2, 2]."}),
            "frequency_penalty": _nullable({**FINITE, "description": "Clamped to [-2, 2]."}),
            "repetition_penalty": _nullable(
                {"type": "number", "exclusiveMinimum": 0, "maximum": REPETITION_PENALTY_MAX}
            ),
            "logit_bias": _nullable(
                {"type": "object", "maxProperties": MAX_LOGIT_BIAS, "additionalProperties": True}
            ),
            "ignore_eos": _nullable(
                {"type": "boolean", "description": "true: end-of-turn tokens are never drawn."}
            ),
            "user": _nullable(STRING),
            "session_id": _nullable(
                {
                    "type": "string",
                    "maxLength": IDENTIFIER_MAX,
                    "description": "Prefix-cache session key (one prompt only).",
                }
            ),
            "speculation": field_schema(SpeculationField()),
        },
        ("prompt",),
        additionalProperties=True,
        description="Fields not listed are accepted and ignored. No chat template: the prompt "
        "is tokenized as written (special tokens recognised, BOS where the model adds one).",
    )
    logprobs = _nullable(
        _object(
            {
                "tokens": {"type": "array", "items": STRING},
                "token_logprobs": {"type": "array", "items": _nullable(NUMBER)},
                "top_logprobs": {
                    "type": "array",
                    "items": _nullable({"type": "object", "additionalProperties": NUMBER}),
                },
                "text_offset": {"type": "array", "items": NON_NEGATIVE},
            },
            ("tokens", "token_logprobs", "top_logprobs", "text_offset"),
        )
    )
    usage = _object(
        {
            "prompt_tokens": NON_NEGATIVE,
            "completion_tokens": NON_NEGATIVE,
            "total_tokens": NON_NEGATIVE,
        },
        ("prompt_tokens", "completion_tokens", "total_tokens"),
    )
    completion = _object(
        {
            "id": STRING,
            "object": {"const": "text_completion"},
            "created": NON_NEGATIVE,
            "model": STRING,
            "choices": {
                "type": "array",
                "items": _object(
                    {
                        "text": STRING,
                        "index": NON_NEGATIVE,
                        "logprobs": logprobs,
                        "finish_reason": {"enum": ["stop", "length", "repetition_loop"]},
                    },
                    ("text", "index", "logprobs", "finish_reason"),
                ),
            },
            "usage": usage,
        },
        ("id", "object", "created", "model", "choices", "usage"),
    )
    embedding_request = _object(
        {
            "model": model,
            "input": _inputs(
                f"at most {MAX_TOTAL_TOKENS} tokens in all; each within the window",
                MAX_INPUTS,
                min_length=1,
            ),
            "encoding_format": _nullable(
                {
                    "enum": list(ENCODINGS),
                    "description": "float (default) or base64: little-endian float32.",
                }
            ),
            "dimensions": _nullable(
                {**INT64, "minimum": 1, "description": "Only the model's width (else a 400)."}
            ),
            "user": _nullable(STRING),
        },
        ("input",),
        additionalProperties=True,
    )
    embeddings = _object(
        {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": _object(
                    {
                        "object": {"const": "embedding"},
                        "index": NON_NEGATIVE,
                        "embedding": {
                            "anyOf": [{"type": "array", "items": NUMBER}, STRING],
                            "description": "L2-normalised; base64 text with encoding_format "
                            "base64.",
                        },
                    },
                    ("object", "index", "embedding"),
                ),
            },
            "model": STRING,
            "usage": _object(
                {"prompt_tokens": NON_NEGATIVE, "total_tokens": NON_NEGATIVE},
                ("prompt_tokens", "total_tokens"),
            ),
        },
        ("object", "data", "model", "usage"),
    )
    piece = _object(
        {
            "id": NON_NEGATIVE,
            "piece": {
                "anyOf": [STRING, {"type": "array", "items": NON_NEGATIVE}],
                "description": "The token's text, or its bytes when they are not whole UTF-8.",
            },
        },
        ("id", "piece"),
    )
    return {
        "CompletionRequest": completion_request,
        "TextCompletion": completion,
        "EmbeddingRequest": embedding_request,
        "EmbeddingList": embeddings,
        "TokenizeRequest": _object(
            {
                "model": model,
                "content": STRING,
                "add_special": _nullable(
                    {**BOOL, "description": "Default false: add BOS (where the model does)."}
                ),
                "with_pieces": _nullable(BOOL),
                "parse_special": _nullable(
                    {"const": True, "description": "Special tokens are always recognised."}
                ),
            },
            ("content",),
            additionalProperties=True,
        ),
        "Tokens": _object(
            {
                "tokens": {
                    "anyOf": [
                        {"type": "array", "items": NON_NEGATIVE},
                        {"type": "array", "items": piece},
                    ]
                }
            },
            ("tokens",),
        ),
        "DetokenizeRequest": _object(
            {"model": model, "tokens": {"type": "array", "items": _TOKEN_ID}},
            ("tokens",),
            additionalProperties=True,
        ),
        "Content": _object({"content": STRING}, ("content",)),
    }


def add_paths(paths: dict[str, dict]) -> None:
    """Add /v1/completions, /v1/embeddings, /tokenize and /detokenize to `paths` (before
    openapi.py adds the layers' errors and the preflights)."""
    paths["/v1/completions"] = {
        "post": _operation(
            "/v1/completions",
            "createCompletion",
            "OpenAI's legacy completion of a raw prompt, no chat template (JSON or SSE)",
            {
                "description": "A text_completion, or (stream: true) an event stream.",
                "content": {
                    JSON: {"schema": _ref("TextCompletion")},
                    SSE: {
                        "schema": sse_event(
                            "`data: {text_completion}` chunks (each choice's "
                            "echo, its text pieces, a closing chunk with finish_reason; a usage "
                            "chunk with stream_options.include_usage), then `data: [DONE]`; a "
                            "refusal after the stream opened is a terminal `data: {error}`."
                        )
                    },
                },
            },
            (400, 404, 429, 503),
            body=_ref("CompletionRequest"),
            parameters=[_session_header()],
            tag="client",
        )
    }
    paths["/v1/embeddings"] = {
        "post": _operation(
            "/v1/embeddings",
            "createEmbedding",
            "Embeddings: each input's final hidden states pooled (the model's pooling load "
            "option) and L2-normalised",
            _ok(_ref("EmbeddingList")),
            (400, 404, 429, 503),
            body=_ref("EmbeddingRequest"),
            tag="client",
        )
    }
    paths["/tokenize"] = {
        "post": _operation(
            "/tokenize",
            "tokenize",
            "llama.cpp's /tokenize: a text's token ids (with pieces on request)",
            _ok(_ref("Tokens")),
            (400, 404, 429, 503),
            body=_ref("TokenizeRequest"),
            tag="client",
        )
    }
    paths["/detokenize"] = {
        "post": _operation(
            "/detokenize",
            "detokenize",
            "llama.cpp's /detokenize: token ids back to text",
            _ok(_ref("Content")),
            (400, 404, 429, 503),
            body=_ref("DetokenizeRequest"),
            tag="client",
        )
    }
