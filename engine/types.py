"""Frozen dataclasses that cross the engine boundary (HTTP edge <-> engine thread)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Defaults the contract documents for /v1/chat/completions.
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MAX_TOKENS = 1024
NONPOSITIVE_MAX_TOKENS = 512
MAX_TOKENS_CLAMP = 1_048_576


@dataclass(frozen=True)
class ModelConfig:
    """What an operator asked for when loading a model. Zero means "engine default"."""

    name: str
    path: str
    ctx_cap: int = 0  # 0 -> min(the GGUF's context_length, DEFAULT_CTX_CAP)
    max_sessions: int = 4
    max_concurrent: int = 0  # 0 -> max_sessions (the contract's rule)
    reasoning_budget: int = 0  # 0 -> unbounded
    chat_template: str = ""  # template text used instead of the GGUF's ("" -> the GGUF's)
    # Prompt tokens per forward pass, and per scheduler step: bounds attention scratch
    # memory and how long one prompt's prefill holds up the running streams.
    prefill_chunk: int = 256
    # A stream's token events leave for its event loop at most once per this many seconds
    # (the first at once, the rest of a finished sequence at once): tokens that come
    # faster join into one chunk on the wire. Each hand-over wakes the loop, which renders
    # and sends a chunk on the cores the kernels run on, and the client parses it: at
    # ~200 tok/s on 2 cores that was ~0.6 ms of CPU a token. 0: every step's tokens leave
    # with the step (PANTHEON_STREAM_INTERVAL_MS).
    stream_interval_s: float = 0.02
    queue_depth: int = 32  # requests waiting for a slot beyond the running ones (BS_QUEUE_DEPTH)
    queue_timeout_s: float = 30.0  # a request waiting longer is refused as busy
    # The share of the slots `batch`-class requests may hold (serving/priority.py); an
    # interactive request takes a batch one's slot at the next step whatever the share.
    batch_share: float = 1.0
    # Prepared float32 weights cached on disk by content, memory-mapped on the next load
    # ("" = no cache); least recently used models are evicted past the cap.
    weight_cache_dir: str = ""
    weight_cache_max_bytes: int = 8 << 30
    # A free slot keeps its last request's KV for a prompt beginning with the same tokens
    # (serving/slot_cache.py); False: only a session's next turn resumes (PANTHEON_PREFIX_CACHE).
    prefix_cache: bool = True
    # Host memory for kept prefixes that admission overwrote (slot_cache: spilled), loaded
    # back for a prompt they continue; 0: none (PANTHEON_PREFIX_CACHE_RAM_MB).
    prefix_cache_ram_bytes: int = 256 << 20
    # Sessions (prefix cache): an idle session id is dropped after this long; a watched
    # one once its last watch has been gone this long; at most this many watches held.
    session_idle_ttl_s: float = 12 * 3600.0
    session_watch_grace_s: float = 45.0
    max_watches: int = 64
    # An implicit session (an id the server chose: the Responses API's chain) is dropped
    # after this long idle, and is evicted first when an explicit session needs its slot.
    session_implicit_ttl_s: float = 300.0
    # Per API key (namespace; not the open one): session ids and watches it may hold at
    # once. 0: half of max_sessions / max_watches, at least 1.
    key_max_sessions: int = 0
    key_max_watches: int = 0
    # The compute backend the weights live on and run through (kernels.BACKENDS): "auto"
    # is the compiled CPU kernels when built, else numpy (PANTHEON_BACKEND).
    backend: str = "auto"
    # Float matrices (F32, F16, BF16) quantised to Q8_0 at load (the `quantize` load
    # option; compiled CPU kernels only).
    quantize: bool = False
    # What the KV cache stores keys and values as (kernels/kv_types.py; the `kv_dtype`
    # load option): "f32" (exact, the default), "f16" (half the bytes) or "q8_0" (~3.8x
    # fewer); the narrow types trade a bounded drift of the logits for sessions and context.
    kv_dtype: str = "f32"
    # How /v1/embeddings pools a text's hidden states: "mean", "last" or "cls" ("": the
    # architecture's default, serving/embedding.py; the `pooling` load option).
    pooling: str = ""
    # Die ordinals (kernels.devices.dies) the layers are split across, in order; () with backend
    # "cuda" means die 0, and with any other backend no die at all (host memory).
    dies: tuple[int, ...] = ()
    # Exact speculative decoding (serving/speculation.py): "auto" drafts tokens from the
    # context and a request's `prediction` and verifies them in one pass (the same tokens
    # as without it); "off" never drafts (PANTHEON_SPECULATION). `spec_max_draft`: the most
    # tokens drafted per step for one sequence; fewer where a longer pass costs more per
    # row than it saves (speculation.PassCosts measures it on the running model).
    speculation: str = "auto"
    spec_max_draft: int = 7
    # A draft model for speculation (serving/draft_model.py): a GGUF with this model's
    # vocabulary, run greedily a few tokens ahead where the context and a prediction
    # draft nothing ("" = none; the `draft_model` load option).
    draft_model: str = ""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = DEFAULT_TEMPERATURE  # <= 0 is greedy argmax
    top_k: int = DEFAULT_TOP_K  # <= 0 disables
    top_p: float = DEFAULT_TOP_P  # >= 1 disables
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # OpenAI penalties over the tokens generated so far, each clamped to [-2, 2]:
    # presence subtracts once per token seen, frequency once per occurrence.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # llama.cpp-style (extension): a seen token's positive logit is divided by it, a
    # negative one multiplied; 1 disables.
    repetition_penalty: float = 1.0
    min_p: float = 0.0  # extension: drop tokens below min_p x the top probability
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token, [0, 20]
    # llama.cpp's (and vLLM's) extension: the model's end-of-turn tokens are never drawn,
    # so the answer runs to max_tokens or a stop string (the serving loop bans them).
    ignore_eos: bool = False


MAX_CHOICES = 8  # the contract's cap on `n`


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    # Choices: each a full separate decode sharing the prompt's prefill. Choice i samples
    # with seed + i when a seed is given.
    n: int = 1
    # Prefix-cache key: the turn resumes from the id's conversation its prompt continues
    # (delta prefill), and choice 0's state is kept for the next turn.
    session_id: str | None = None
    # The server chose `session_id`, not the client: a cache that makes no one wait
    # (serving/sessions.py: a short TTL, evicted first, never written to disk).
    session_implicit: bool = False
    # Whose prompts may share KV through the prefix cache (the caller's API key's
    # namespace): a slot's kept tokens are reused only by a request of the same namespace,
    # so one key never learns from cached_tokens (or timing) what another key sent.
    cache_namespace: str = ""
    # Think-style template: split `<think>...</think>` out as reasoning; `think_open`: the
    # prompt itself opened the block (the answer starts inside it).
    think_style: bool = False
    think_open: bool = False
    # Harmony (gpt-oss): the answer is messages on channels (decoding/harmony.py), split
    # into reasoning, content and tool calls.
    harmony: bool = False
    reasoning_budget: int = 0  # reasoning tokens before `</think>` is forced; <= 0: none
    # response_format: the compiled plan (response_format.ConstraintPlan) or None, and the
    # status to report when the request sent one (None: it did not).
    constraint: object = None
    format_status: str | None = None
    # Tool calling: the dialect (tool_dialects.Dialect) whose calls are parsed out of the
    # answer, and the offered tools (tool_dialects.ToolSpec); None: no tools.
    tool_dialect: object = None
    tools: tuple = ()
    # tool_choice "required" or a named function: a turn the model ends (end token) where
    # only the call's closing tags are missing gets them appended.
    tool_compelled: bool = False
    # Speculative decoding: "auto" lets the engine draft (when the model's config does),
    # "off" never; `prediction`: token ids of the output the client expects (OpenAI
    # Predicted Outputs), drafted from first. Neither ever changes the tokens generated.
    speculation: str = "auto"
    prediction: tuple[int, ...] = ()
    # Priority class (serving/priority.py): "interactive" or "batch" (Batches API lines,
    # or a request that asked for it): batch work yields its slots to interactive work.
    priority: str = "interactive"
    # Messages truncation "auto" dropped from the conversation (reported in Usage).
    truncated_messages: int = 0


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and its most likely alternatives."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, float, tuple[int, ...]], ...] = ()  # (token, logprob, bytes)


@dataclass(frozen=True)
class TokenEvent:
    """Newly produced answer text of choice `index`: whole UTF-8 characters, stop strings
    withheld; `reasoning` is text inside a think block, `text` the answer."""

    text: str
    token_ids: tuple[int, ...]
    index: int = 0
    reasoning: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    tool_calls: tuple = ()  # tool_dialects.CallOpened / ArgumentsDelta, in order


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    kv_used: int
    kv_cap: int
    # Two conversations of one session id keep displacing each other's cache.
    session_conflict: bool = False
    reasoning_tokens: int = 0  # of the completion tokens, those inside a think block
    # Of the tokens drafted from the request's `prediction`: verified and emitted, and
    # proposed but rejected (OpenAI's completion_tokens_details).
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    # Messages dropped from the start of the conversation to fit (truncation "auto").
    truncated_messages: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class FinishEvent:
    """Last event of one choice. A request's stream ends after `choices` of them (all
    `n`: choices beyond the served slots run as the request's slots free)."""

    finish_reason: str  # "stop" | "length" | "repetition_loop"
    usage: Usage  # this choice's; the prompt is the request's, counted once by the caller
    index: int = 0
    choices: int = 1
    response_format_status: str | None = None
    response_format_message: str = ""  # why a status is not_enforced (a check timed out)
    tool_calls: tuple = ()  # tool_dialects.ParsedCall: the calls parsed from the answer
    tool_call_errors: tuple = ()  # tool_dialects.CallError: calls started, not finished
    stop_sequence: str = ""  # the stop string that ended the choice ("" for none)
    # The engine's clock, for metrics (seconds): the request's wait in the queue before its
    # slots were given, from its arrival at the engine to this choice's first token, and
    # from that token to this finish. Measurements, not the answer: left out of ==.
    queue_wait_s: float = field(default=0.0, compare=False)
    first_token_s: float = field(default=0.0, compare=False)
    decode_s: float = field(default=0.0, compare=False)


class EngineError(Exception):
    """Base for errors the HTTP layer maps onto the contract's error shape."""


class ContextOverBudget(EngineError):
    """The prompt does not fit the context window. The message starts with OpenAI's
    wording (clients such as LiteLLM and LangChain recognise an overflow by it);
    `at_least`: the tokenizer refused the text untokenized, so `prompt_tokens` is a lower
    bound."""

    def __init__(self, prompt_tokens: int, kv_cap: int, at_least: bool = False):
        self.prompt_tokens = prompt_tokens
        self.kv_cap = kv_cap
        self.at_least = at_least
        count = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        super().__init__(
            f"This model's maximum context length is {kv_cap} tokens. However, your "
            f"messages resulted in {count} tokens. Please reduce the length of the "
            f"messages (kv_used={prompt_tokens}, kv_cap={kv_cap}); shorten the "
            f"conversation and retry."
        )


class ServerBusy(EngineError):
    """Every slot is busy and the queue is full, or the wait in the queue timed out."""

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ServerMemoryConstrained(EngineError):
    """Memory pressure: the prompt does not fit what the server can hold right now."""

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ServerShuttingDown(EngineError):
    """The server (or this model) is draining: no new generations are admitted."""


class GenerationFailed(EngineError):
    pass


class ModelLoadError(EngineError):
    pass


class UnsupportedArchitecture(ModelLoadError):
    """The GGUF's `general.architecture` is not one this engine implements; the message
    names it and the supported ones (the server answers 400, not 500)."""


class IncompatibleDraftModel(ModelLoadError):
    """A `draft_model` that cannot draft for its model (another vocabulary, or an
    architecture the engine does not run); the server answers 400 naming why."""


# --- sessions --------------------------------------------------------------------------


class SessionCapacity(EngineError):
    """A new session id while every one of `max_sessions` holds a live session."""

    retry_after = 30


class SessionNotFound(EngineError):
    pass


class SessionBusy(EngineError):
    """A turn is in flight on that session."""


class BadSessionBlob(EngineError):
    """Not a session blob, corrupt, truncated, or made for another architecture/shape."""


class WeightsVersionMismatch(EngineError):
    """The blob was captured under different weights."""


class WatchUnavailable(EngineError):
    """The watch table is full."""
