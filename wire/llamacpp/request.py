"""The bodies of llama-server's POST /completion and POST /infill: a table of fields
(wire/fields.py, the schema /openapi.json shows), its defaults llama-server's, and the
fill-in-the-middle prompt /infill builds from the model's FIM tokens.

One prompt per request (a string, or token ids); llama-server's sampler options this
engine has (temperature, top_k, top_p, min_p, the penalties, seed, stop) are honoured,
the others (mirostat, DRY, XTC, grammar, ...) are accepted and ignored, as unknown
fields are.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import MAX_TOKENS_CLAMP, ContextOverBudget, SamplingParams, TooManyTokens
from pantheon_platform.errors import ApiError, invalid_request
from pantheon_platform.strict_json import IDENTIFIER_MAX, MAX_STOP_STRINGS
from wire.fields import (
    TEXT_MAX,
    Array,
    Boolean,
    Field,
    Integer,
    Number,
    Object,
    Shape,
    String,
    stop_strings,
)
from wire.fields import Table as _Table

# llama-server's documented defaults for /completion.
DEFAULTS = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "n_predict": -1,
}
_TEXT = String(TEXT_MAX)
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}


def _prompt(value: object, path: str) -> str | tuple[int, ...]:
    """A string, or one sequence of token ids."""
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return tuple(value)
    raise invalid_request(
        f"{path}: expected a string or an array of token ids (one prompt per request here)",
        path,
    )


MAX_EXTRA_CHUNKS = 64


def _extra(value: object, path: str) -> tuple[dict, ...]:
    """/infill's input_extra: {"filename", "text"} objects (strings)."""
    if not isinstance(value, list) or len(value) > MAX_EXTRA_CHUNKS:
        raise invalid_request(f"{path}: expected at most {MAX_EXTRA_CHUNKS} objects", path)
    for i, chunk in enumerate(value):
        where = f"{path}.{i}"
        if not isinstance(chunk, dict):
            raise invalid_request(f"{where}: expected an object", where)
        for key, limit in (("filename", IDENTIFIER_MAX), ("text", TEXT_MAX)):
            member = chunk.get(key)
            if member is not None and (not isinstance(member, str) or len(member) > limit):
                raise invalid_request(f"{where}.{key}: a string of at most {limit} characters")
    return tuple(value)


COMMON = _Table(
    Field("model", String(IDENTIFIER_MAX)),
    Field("n_predict", Integer(-1, MAX_TOKENS_CLAMP), default=DEFAULTS["n_predict"]),
    Field("temperature", Number(0, 2), default=DEFAULTS["temperature"]),
    Field("top_k", Integer(0, (1 << 31) - 1), default=DEFAULTS["top_k"]),
    Field("top_p", Number(0, 1), default=DEFAULTS["top_p"]),
    Field("min_p", Number(0, 1), default=DEFAULTS["min_p"]),
    Field("repeat_penalty", Number(0.01, 10), default=DEFAULTS["repeat_penalty"]),
    Field("presence_penalty", Number(-2, 2), default=DEFAULTS["presence_penalty"]),
    Field("frequency_penalty", Number(-2, 2), default=DEFAULTS["frequency_penalty"]),
    Field("seed", Integer(), description="-1 (or absent): a random seed."),
    Field("stop", Array(String(IDENTIFIER_MAX), MAX_STOP_STRINGS, reader=stop_strings), default=()),
    Field("stream", Boolean(), default=False),
    Field("cache_prompt", Boolean(), description="Accepted; prefix caching is automatic."),
    Field(
        "ignore_eos",
        Boolean(),
        default=False,
        description="true: the model's end-of-turn tokens are never drawn.",
    ),
)

COMPLETION = (
    _Table(
        Field(
            "prompt",
            Shape({"anyOf": [_TEXT.schema(), _IDS]}, reader=_prompt),
            required=True,
            nullable=False,
        ),
    )
    + COMMON
)

EXTRA_CHUNK = Object(_Table(Field("filename", String(IDENTIFIER_MAX)), Field("text", _TEXT)))
INFILL = (
    _Table(
        Field("input_prefix", _TEXT, default=""),
        Field("input_suffix", _TEXT, default=""),
        Field("input_extra", Array(EXTRA_CHUNK, MAX_EXTRA_CHUNKS, reader=_extra), default=()),
        Field("prompt", _TEXT, default="", description="Written after the FIM middle token."),
    )
    + COMMON
)


@dataclass(frozen=True)
class GenerateRequest:
    """A /completion or /infill request, read: the prompt the turn runs (a string, or
    token ids) and the rest of the body's fields."""

    prompt: str | tuple[int, ...]
    fields: dict

    @property
    def stream(self) -> bool:
        return bool(self.fields["stream"])

    @property
    def model(self) -> str | None:
        return self.fields["model"] or None

    def max_tokens(self) -> int:
        n_predict = self.fields["n_predict"]
        return MAX_TOKENS_CLAMP if n_predict < 0 else n_predict

    def sampling(self) -> SamplingParams:
        f = self.fields
        seed = f["seed"]
        return SamplingParams(
            temperature=f["temperature"],
            top_k=f["top_k"],
            top_p=f["top_p"],
            min_p=f["min_p"],
            max_tokens=max(1, self.max_tokens()),
            stop=f["stop"],
            seed=None if seed is None or seed < 0 else seed,
            presence_penalty=f["presence_penalty"],
            frequency_penalty=f["frequency_penalty"],
            repetition_penalty=f["repeat_penalty"],
            ignore_eos=bool(f["ignore_eos"]),
        )


def parse_completion(data: dict) -> GenerateRequest:
    if data.get("prompt") is None:
        raise invalid_request("prompt: required", "prompt")
    fields = COMPLETION.read(data)
    return GenerateRequest(fields["prompt"], fields)


# --- /infill ------------------------------------------------------------------------------

# The FIM tokens' GGUF keys, then the spellings model families use when the GGUF has none.
FIM_KEYS = {
    "pre": "tokenizer.ggml.fim_pre_token_id",
    "suf": "tokenizer.ggml.fim_suf_token_id",
    "mid": "tokenizer.ggml.fim_mid_token_id",
    "rep": "tokenizer.ggml.fim_rep_token_id",
    "sep": "tokenizer.ggml.fim_sep_token_id",
}
FIM_SPELLINGS = {
    "pre": ("<|fim_prefix|>", "<fim_prefix>", "<fim-prefix>", "<PRE>"),
    "suf": ("<|fim_suffix|>", "<fim_suffix>", "<fim-suffix>", "<SUF>"),
    "mid": ("<|fim_middle|>", "<fim_middle>", "<fim-middle>", "<MID>"),
    "rep": ("<|repo_name|>", "<repo_name>"),
    "sep": ("<|file_sep|>", "<file_sep>"),
}


def fim_tokens(metadata: dict, tokenizer) -> dict[str, int]:
    """The model's FIM token ids by role (pre, suf, mid; rep and sep when it has them)."""
    out: dict[str, int] = {}
    for role, key in FIM_KEYS.items():
        value = metadata.get(key)
        if isinstance(value, int) and value >= 0:
            out[role] = value
            continue
        for spelling in FIM_SPELLINGS[role]:
            token = tokenizer.token_id(spelling)
            if token is not None:
                out[role] = token
                break
    return out


def not_supported(message: str) -> ApiError:
    """llama-server's not_supported_error, as a 400 (llama-server answers 501): what this
    model cannot do is a refusal of the request, and no request gets a 5xx here but for
    the server's own failure."""
    return ApiError(400, message, "not_supported_error")


def parse_infill(data: dict, metadata: dict, tokenizer, window: int) -> GenerateRequest:
    """The FIM prompt as token ids: with the repo-level tokens, each extra chunk as a file
    (`<rep>myproject`, `<sep>name` text...), else the chunks' text first; then
    `<pre>prefix<suf>suffix<mid>prompt`. A model without FIM tokens is refused (400); a
    text certain to overflow `window` is refused before it is tokenized whole."""
    fields = INFILL.read(data)

    def encode(text: str) -> list[int]:
        try:
            return tokenizer.encode(text, limit=window)
        except TooManyTokens as exc:
            raise ContextOverBudget(exc.at_least, exc.limit, at_least=True) from None

    fim = fim_tokens(metadata, tokenizer)
    missing = [name for name in ("pre", "suf", "mid") if name not in fim]
    if missing:
        words = " ".join(f"{name} token is missing." for name in missing)
        raise not_supported(f"Infill is not supported by this model: {words}")
    ids: list[int] = []
    if tokenizer.add_bos:
        ids.append(tokenizer.bos_id)
    extra = fields["input_extra"]
    if extra and "rep" in fim and "sep" in fim:
        ids += [fim["rep"], *encode("myproject\n")]
        for chunk in extra:
            ids += [fim["sep"], *encode(f"{chunk.get('filename') or ''}\n")]
            ids += encode(chunk.get("text") or "")
        ids += [fim["sep"], *encode("filename\n")]
    else:
        for chunk in extra:
            ids += encode(chunk.get("text") or "")
    ids += [fim["pre"], *encode(fields["input_prefix"])]
    ids += [fim["suf"], *encode(fields["input_suffix"])]
    ids += [fim["mid"], *encode(fields["prompt"])]
    return GenerateRequest(tuple(ids), fields)
