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
    prefill_chunk: int = 512  # prompt tokens per forward pass; bounds attention scratch memory


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = DEFAULT_TEMPERATURE  # <= 0 is greedy argmax
    top_k: int = DEFAULT_TOP_K  # <= 0 disables
    top_p: float = DEFAULT_TOP_P  # >= 1 disables
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class TokenEvent:
    """Newly produced answer text: whole UTF-8 characters, stop strings withheld."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    kv_used: int
    kv_cap: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class FinishEvent:
    """Last event of a generation."""

    finish_reason: str  # "stop" | "length"
    usage: Usage


class EngineError(Exception):
    """Base for errors the HTTP layer maps onto the contract's error shape."""


class ContextOverBudget(EngineError):
    def __init__(self, prompt_tokens: int, kv_cap: int):
        self.prompt_tokens = prompt_tokens
        self.kv_cap = kv_cap
        super().__init__(
            f"prompt is {prompt_tokens} tokens but the context window is {kv_cap} tokens "
            f"(kv_used={prompt_tokens}, kv_cap={kv_cap}); shorten the conversation and retry"
        )


class ServerBusy(EngineError):
    """Single-user path: a generation is already running on this model."""


class GenerationFailed(EngineError):
    pass


class ModelLoadError(EngineError):
    pass
