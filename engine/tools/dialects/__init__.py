"""OpenAI tool calling in the dialects models write: the tools' system text, replaying a
call or a result into a prompt, and parsing a streamed answer into calls.

Qwen3-Coder XML is the default; MiniCPM (llama architecture, a template that adds BOS)
writes the same XML with attribute-style names; served names starting "ornith" write
JSON objects; harmony templates (gpt-oss) write messages to `functions.NAME`.
`CallParser.push` holds markup back until it is known to be a call or plain text, and
decides only on the text seen so far, so any chunking of one answer gives the same
calls, errors and content. Pure: no Django, no model.
"""

from __future__ import annotations

from engine.tools.dialects.base import CallParser, Dialect
from engine.tools.dialects.calls import (
    ArgumentsDelta,
    CallClosed,
    CallError,
    CallOpened,
    Event,
    ParsedCall,
    TextDelta,
    ToolSpec,
    coerce_text,
    parse_tools,
)
from engine.tools.dialects.harmony_calls import HARMONY_DIALECT
from engine.tools.dialects.json_calls import JSON_DIALECT
from engine.tools.dialects.xml_calls import MINICPM_TAGS, MINICPM_XML, QWEN_TAGS, QWEN_XML, XmlTags

__all__ = [
    "HARMONY_DIALECT",
    "JSON_DIALECT",
    "MINICPM_TAGS",
    "MINICPM_XML",
    "QWEN_TAGS",
    "QWEN_XML",
    "ArgumentsDelta",
    "CallClosed",
    "CallError",
    "CallOpened",
    "CallParser",
    "Dialect",
    "Event",
    "ParsedCall",
    "TextDelta",
    "ToolSpec",
    "XmlTags",
    "coerce_text",
    "dialect_for",
    "parse_tools",
]


def dialect_for(
    model_name: str,
    architecture: str = "",
    template_adds_bos: bool = False,
    harmony: bool = False,
) -> Dialect:
    """The dialect a served model writes (the contract's table): a harmony template or
    the gpt-oss architecture -> harmony; served names starting "ornith" -> JSON;
    llama-architecture models whose chat template adds BOS (MiniCPM) -> MiniCPM XML; else
    Qwen3-Coder XML."""
    if harmony or architecture == "gpt-oss":
        return HARMONY_DIALECT
    if model_name.lower().startswith("ornith"):
        return JSON_DIALECT
    if architecture == "llama" and template_adds_bos:
        return MINICPM_XML
    return QWEN_XML
