"""POST /tokenize and POST /detokenize in llama.cpp's shape.

/tokenize {content, add_special (default false: no BOS), with_pieces (default false),
parse_special (true only: special tokens in the text are recognised)} ->
{tokens: [ids]} or, with pieces, {tokens: [{id, piece}]} where a piece that is not whole
UTF-8 is its bytes as an array of ints (llama.cpp's form). /detokenize {tokens} ->
{content}. Optional `model` (default: the only loaded model, as on the chat route).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from rest_framework import serializers

from pantheon_platform.chat_http import off_loop, turn_deadline
from pantheon_platform.errors import invalid_request
from pantheon_platform.json_slices import sliced_json_response
from pantheon_platform.request_log import note
from pantheon_platform.runtime import get_runtime
from pantheon_platform.strict_json import (
    StrictBooleanField,
    StrictCharField,
    invalid_errors,
    parse_json_object,
)
from wire.completions.common import ModelField, is_token_id
from wire.route import OPENAI_ERRORS, RouteCall, post_route


class TokenizeRequest(serializers.Serializer):
    model = ModelField()
    content = StrictCharField(allow_blank=True, trim_whitespace=False)
    add_special = StrictBooleanField(required=False, allow_null=True)
    with_pieces = StrictBooleanField(required=False, allow_null=True)
    # llama.cpp's default: special tokens written in the text are recognised.
    parse_special = StrictBooleanField(required=False, allow_null=True)

    def validate_parse_special(self, value):
        if value is False:
            raise serializers.ValidationError(
                "false is not supported: special tokens written in the text are always recognised"
            )
        return value


class DetokenizeRequest(serializers.Serializer):
    model = ModelField()
    tokens = serializers.JSONField()

    def validate_tokens(self, value):
        if not isinstance(value, list) or not all(is_token_id(t) for t in value):
            raise serializers.ValidationError("expected an array of token ids (integers >= 0)")
        return value


def _parsed(serializer_class, body: bytes):
    request = serializer_class(data=parse_json_object(body))
    if not request.is_valid():
        raise invalid_errors(request.errors)
    return request.validated_data


def piece(tokenizer, token_id: int):
    raw = tokenizer.token_bytes(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def tokenized(svc, data: dict) -> dict:
    tokenizer = svc.tokenizer
    # int32, not a list of Python ints: a huge text's ids as ints are ~36 bytes each, and
    # a flood of them left their small-object pools with the process (issue 36's soak).
    ids = tokenizer.encode_array(data["content"], add_special=bool(data.get("add_special")))
    if data.get("with_pieces"):
        return {"tokens": [{"id": i, "piece": piece(tokenizer, i)} for i in ids.tolist()]}
    return {"tokens": ids}


def detokenized(svc, data: dict) -> dict:
    tokenizer = svc.tokenizer
    ids = data["tokens"]
    bad = next((t for t in ids if t >= tokenizer.vocab_size), None)
    if bad is not None:
        raise invalid_request(
            f"tokens: id {bad} is outside this model's {tokenizer.vocab_size}-token vocabulary",
            "tokens",
        )
    return {"content": tokenizer.decode(ids)}


def _view(serializer_class, work, what: str):
    @post_route(OPENAI_ERRORS, f"{what} failed", drain=False)
    async def view(request: HttpRequest, call: RouteCall) -> HttpResponse:
        deadline = turn_deadline()
        data = await off_loop(deadline, lambda: _parsed(serializer_class, request.body))
        name, svc = get_runtime().resolve(data.get("model"))
        note(request, model=name)
        # Rendered on the worker too: a 30 MB text's ids are ~8 MB of JSON, whose encoding
        # on the event loop would stall every stream.
        return await off_loop(deadline, lambda: sliced_json_response(work(svc, data)))

    view.__name__ = what
    return view


tokenize = _view(TokenizeRequest, tokenized, "tokenize")
detokenize = _view(DetokenizeRequest, detokenized, "detokenize")
