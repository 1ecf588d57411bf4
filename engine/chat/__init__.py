"""The chat core: one Turn in, one stream of events out, for every wire format."""

from .core import (
    CallJoiner,
    ChoiceResult,
    PreparedTurn,
    ToolCall,
    ToolPlan,
    TurnResult,
    collect,
    prepare_turn,
    request_usage,
    run_turn,
    worst_format_status,
)
from .prompt import PromptBuilder
from .turn import ChatOptions, InvalidTurn, Turn

__all__ = [
    "CallJoiner",
    "ChatOptions",
    "ChoiceResult",
    "InvalidTurn",
    "PreparedTurn",
    "PromptBuilder",
    "ToolCall",
    "ToolPlan",
    "Turn",
    "TurnResult",
    "collect",
    "prepare_turn",
    "request_usage",
    "run_turn",
    "worst_format_status",
]
