"""POST /v1/embeddings: OpenAI's embeddings on the model's engine thread.

Each input (a string, or token ids) is tokenized as a raw prompt (BOS where the GGUF adds
one) on the prepare pool, then prefilled alone in chunks on a scratch cache (no KV kept)
and its final-normed hidden states pooled (the model's `pooling` load option: mean, last
or cls) and L2-normalised (ModelService.embed). A chat model embeds honestly but is no
trained embedding model: README says what the shipped one gives.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from django.http import HttpRequest, HttpResponse
from rest_framework import serializers

from engine import ContextOverBudget, TooManyTokens
from pantheon_platform.chat_http import off_loop, turn_deadline
from pantheon_platform.errors import invalid_request
from pantheon_platform.json_slices import sliced_json_response
from pantheon_platform.request_log import note
from pantheon_platform.runtime import get_runtime
from pantheon_platform.strict_json import (
    StrictCharField,
    StrictIntegerField,
    invalid_errors,
    parse_json_object,
)
from wire.completions.common import ModelField, text_inputs
from wire.route import OPENAI_ERRORS, RouteCall, post_route

# OpenAI's bounds: at most 2048 inputs, 300,000 tokens summed over them.
MAX_INPUTS = 2048
MAX_TOTAL_TOKENS = 300_000
ENCODINGS = ("float", "base64")


class EmbeddingRequest(serializers.Serializer):
    model = ModelField()
    input = serializers.JSONField()
    encoding_format = serializers.ChoiceField(ENCODINGS, required=False, allow_null=True)
    dimensions = StrictIntegerField(required=False, allow_null=True, min_value=1)
    user = StrictCharField(required=False, allow_null=True, allow_blank=True)

    def validate_input(self, value):
        inputs = text_inputs(value, "inputs", MAX_INPUTS)
        if any(isinstance(i, str) and not i for i in inputs):
            raise serializers.ValidationError("an input is an empty string: nothing to embed")
        return inputs


def validated(body: bytes) -> EmbeddingRequest:
    request = EmbeddingRequest(data=parse_json_object(body))
    if not request.is_valid():
        raise invalid_errors(request.errors)
    return request


def token_lists(svc, inputs) -> list[list[int]]:
    """Each input's ids (strings tokenized like a raw prompt), checked against the
    vocabulary, the window and the request's token bound."""
    window = svc.context_window_configured
    vocab = svc.tokenizer.vocab_size
    out, total = [], 0
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            try:
                ids = svc.encode_raw(item)
            except TooManyTokens as exc:
                raise ContextOverBudget(exc.at_least, exc.limit, at_least=True) from None
        else:
            ids = list(item)
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise invalid_request(
                    f"input[{i}]: token id {bad} is outside this model's {vocab}-token vocabulary",
                    "input",
                )
        if not ids:
            raise invalid_request(f"input[{i}]: no tokens to embed", "input")
        if len(ids) > window:
            raise ContextOverBudget(len(ids), window)
        total += len(ids)
        if total > MAX_TOTAL_TOKENS:
            raise invalid_request(
                f"input: more than {MAX_TOTAL_TOKENS} tokens in one request; send fewer "
                "inputs per request",
                "input",
            )
        out.append(ids)
    return out


def encoded(vector: np.ndarray, encoding: str):
    if encoding == "base64":  # OpenAI's: the float32 values, little-endian, base64
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


@post_route(OPENAI_ERRORS, "embeddings failed")
async def embeddings(request: HttpRequest, call: RouteCall) -> HttpResponse:
    deadline = turn_deadline()
    req = await off_loop(deadline, lambda: validated(request.body))
    data = req.validated_data
    name, svc = get_runtime().resolve(data.get("model"))
    note(request, model=name)
    dimensions = data.get("dimensions")
    if dimensions is not None and dimensions != svc.embedding_width:
        raise invalid_request(
            f"dimensions: this model's embeddings have {svc.embedding_width} dimensions "
            f"and cannot be shortened; leave dimensions out (or send "
            f"{svc.embedding_width})",
            "dimensions",
        )
    lists = await off_loop(deadline, lambda: token_lists(svc, data["input"]))
    vectors = await asyncio.wrap_future(svc.embed(lists))
    encoding = data.get("encoding_format") or "float"
    tokens = sum(len(ids) for ids in lists)
    body = lambda: {  # noqa: E731
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encoded(v, encoding)}
            for i, v in enumerate(vectors)
        ],
        "model": name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    # Off the event loop: a large batch's vectors are megabytes of JSON.
    return await asyncio.to_thread(lambda: sliced_json_response(body()))
