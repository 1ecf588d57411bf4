"""The engine's public surface: what the apps (wire/, pantheon_platform/, operators/,
sessions/, cluster/, ...) may import, as `from engine import Name`. Nothing outside the
engine imports deeper (tests/test_layering.py checks it); inside, modules import each
other by their full paths.

Names resolve lazily (PEP 562), so `import engine.types` does not load the whole engine,
and a name moving between modules inside changes only this table. No Django here, ever.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # the frozen types, events and errors that cross the boundary
    "BadSessionBlob": "engine.types",
    "ContextOverBudget": "engine.types",
    "DEFAULT_MAX_TOKENS": "engine.types",
    "DEFAULT_TEMPERATURE": "engine.types",
    "DEFAULT_TOP_K": "engine.types",
    "DEFAULT_TOP_P": "engine.types",
    "EngineError": "engine.types",
    "FinishEvent": "engine.types",
    "GenerationFailed": "engine.types",
    "MAX_CHOICES": "engine.types",
    "MAX_TOKENS_CLAMP": "engine.types",
    "ModelConfig": "engine.types",
    "ModelLoadError": "engine.types",
    "UnsupportedArchitecture": "engine.types",
    "IncompatibleDraftModel": "engine.types",
    "NONPOSITIVE_MAX_TOKENS": "engine.types",
    "SamplingParams": "engine.types",
    "ServerBusy": "engine.types",
    "ServerMemoryConstrained": "engine.types",
    "ServerShuttingDown": "engine.types",
    "SessionBusy": "engine.types",
    "SessionCapacity": "engine.types",
    "SessionNotFound": "engine.types",
    "TokenEvent": "engine.types",
    "Usage": "engine.types",
    "WatchUnavailable": "engine.types",
    "WeightsVersionMismatch": "engine.types",
    # the chat core: a turn in, events out
    "ChatOptions": "engine.chat.turn",
    "InvalidTurn": "engine.chat.turn",
    "Turn": "engine.chat.turn",
    "CallJoiner": "engine.chat.core",
    "PreparedTurn": "engine.chat.core",
    "ToolCall": "engine.chat.core",
    "TurnResult": "engine.chat.core",
    "collect": "engine.chat.core",
    "prepare_turn": "engine.chat.core",
    "request_usage": "engine.chat.core",
    "run_turn": "engine.chat.core",
    "worst_format_status": "engine.chat.core",
    # tool calls as they stream
    "ArgumentsDelta": "engine.tools.dialects.calls",
    "CallOpened": "engine.tools.dialects.calls",
    # text
    "TooManyTokens": "engine.text.tokenizer",
    "ChatTemplate": "engine.text.chat_template",
    "ChatTemplateError": "engine.text.chat_template",
    # loading
    "ModelFileNotFound": "engine.loading.gguf_file",
    "LoadProgress": "engine.loading.progress",
    "peek_gguf": "engine.loading.gguf_open",
    # serving: the per-model service and its session table
    "FALLBACK_PREFILL_TOK_PER_S": "engine.serving.admission",
    "WORK_OWNER": "engine.serving.jobs",
    "ModelService": "engine.serving.service",
    "OPEN": "engine.serving.session_key",
    "SessionKey": "engine.serving.session_key",
    "POOLINGS": "engine.serving.embedding",
    # one conversation's KV as bytes (exported, spilled, restored)
    "encode_session_blob": "engine.serving.session_blob:encode",
    "encode_session_blob_parts": "engine.serving.session_blob:encode_parts",
    "read_session_blob_header": "engine.serving.session_blob_read:read_header",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        where = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'engine' has no attribute {name!r}") from None
    module, _, attribute = where.partition(":")
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value  # once resolved, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
