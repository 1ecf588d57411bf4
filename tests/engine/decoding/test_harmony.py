"""Harmony answers (gpt-oss): the channel splitter and the harmony tool dialect together
give the same reasoning, content, calls and errors however the answer is chunked, and
text that is not harmony is shown as content, never lost."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from engine.decoding.harmony import HarmonySplitter, is_harmony_template, message_kind
from engine.text.chat_template import CHATML_TEMPLATE
from engine.tools.dialects import (
    HARMONY_DIALECT,
    ArgumentsDelta,
    CallClosed,
    CallOpened,
    TextDelta,
    parse_tools,
)

TOOLS = parse_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather of a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"],
                },
            },
        }
    ]
)

ANALYSIS = "<|channel|>analysis<|message|>The user asks for 2+2. Easy: 4.<|end|>"
ANSWER = "2 + 2 = 4.\n\nAnything else?"
FINAL = "<|start|>assistant<|channel|>final<|message|>" + ANSWER
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "days": 2}'
)
WEATHER = {"city": "Paris", "days": 2}
GPTOSS_TEMPLATE = Path(__file__).parents[1] / "text" / "fixtures" / "gpt-oss.jinja"


def run(text: str, chunks: list[str] | None = None, ended: bool = True, tools=TOOLS):
    """(reasoning, content, calls, errors, events) for an answer pushed in `chunks`: the
    splitter then the dialect's parser, as ChoiceOutput chains them."""
    splitter, parser = HarmonySplitter(), HARMONY_DIALECT.parser(tools)
    reasoning, events = [], []
    for chunk in chunks if chunks is not None else [text]:
        r, c = splitter.push(chunk)
        reasoning.append(r)
        events += parser.push(c) if c else []
    r, c = splitter.flush(ended)
    reasoning.append(r)
    events += parser.push(c) if c else []
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [(c.name, c.arguments) for c in parser.calls]
    errors = [e.code for e in parser.errors]
    return "".join(reasoning), content, calls, errors, events


def random_chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


CASES = [
    ("analysis then final", ANALYSIS + FINAL, "The user asks for 2+2. Easy: 4.", ANSWER, [], []),
    ("final only", FINAL[len("<|start|>assistant") :], "", ANSWER, [], []),
    (
        "analysis then a call",
        ANALYSIS + CALL,
        "The user asks for 2+2. Easy: 4.",
        "",
        [("get_weather", WEATHER)],
        [],
    ),
    (
        "a call with its recipient in the role part",
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}',
        "",
        "",
        [("get_weather", {"city": "Paris"})],
        [],
    ),
    (
        "a preamble, then a call",
        "<|channel|>commentary<|message|>Let me look.<|end|>" + CALL,
        "",
        "Let me look.",
        [("get_weather", WEATHER)],
        [],
    ),
    (
        "a stray commentary before the analysis",
        "<|channel|>commentary to=assistant<|channel|>analysis<|message|>hm<|end|>"
        "<|start|>assistant<|channel|>final<|message|>ok",
        "hm",
        "ok",
        [],
        [],
    ),
    (
        "an end left out before the next header",
        "<|channel|>analysis<|message|>think<|channel|>final<|message|>done",
        "think",
        "done",
        [],
        [],
    ),
    (
        "plain text, not harmony",
        "Just text, <b>no</b> markup.",
        "",
        "Just text, <b>no</b> markup.",
        [],
        [],
    ),
    (
        "a broken header is content as written",
        "<|channel|>final<|end|>What?",
        "",
        "<|channel|>final<|end|>What?",
        [],
        [],
    ),
    (
        "text after a message that is no header",
        "<|channel|>final<|message|>Hi<|end|> and more",
        "",
        "Hi and more",
        [],
        [],
    ),
    (
        "a call to a function not offered",
        "<|channel|>commentary to=functions.nope<|message|>{}",
        "",
        "",
        [],
        ["unknown_function"],
    ),
    (
        "arguments that are not JSON",
        "<|channel|>commentary to=functions.get_weather<|message|>{city: Paris",
        "",
        "",
        [],
        ["malformed_call"],
    ),
]


@pytest.mark.parametrize(
    "text,reasoning,content,calls,errors", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_chunking_gives_the_same_split(text, reasoning, content, calls, errors):
    whole = run(text)
    assert whole[:4] == (reasoning, content, calls, errors)
    assert run(text, list(text))[:4] == whole[:4]  # one character at a time
    for cut in range(1, len(text)):
        assert run(text, [text[:cut], text[cut:]])[:4] == whole[:4]
    rng = random.Random(len(text))
    for _ in range(50):
        assert run(text, random_chunks(text, rng))[:4] == whole[:4]


def test_a_call_streams_the_events_of_the_other_dialects():
    events = run(ANALYSIS + CALL)[4]
    assert [type(e) for e in events] == [CallOpened, ArgumentsDelta, CallClosed]
    assert events[0].name == "get_weather"
    assert json.loads(events[1].text) == WEATHER
    assert events[2].call.arguments == WEATHER


def test_a_call_cut_off_by_a_limit_is_incomplete_not_content():
    reasoning, content, calls, errors, _ = run(ANALYSIS + CALL[:-5], ended=False)
    assert (content, calls, errors) == ("", [], ["incomplete_call"])


def test_the_end_tokens_in_the_text_close_messages_too():
    text = ANALYSIS + CALL + "<|call|>"
    assert run(text, ended=False)[2] == [("get_weather", WEATHER)]
    assert run(ANALYSIS + FINAL + "<|return|>", ended=False)[1] == ANSWER


def test_without_tools_a_call_is_shown_as_its_markup():
    splitter = HarmonySplitter()
    _, content = splitter.push(CALL)
    _, rest = splitter.flush(True)
    assert content + rest == (
        '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris", "days": 2}'
        "<|call|>"
    )


def test_partial_markup_is_held_back_then_released():
    splitter = HarmonySplitter()
    assert splitter.push("<|chan") == ("", "")
    assert splitter.push("nel|>analysis<|message|>a<|e") == ("a", "")
    assert splitter.in_think
    assert splitter.push("nd|>") == ("", "")
    assert not splitter.in_think
    assert splitter.push("<|start|>assistant<|channel|>final<|message|>b<|ret") == ("", "b")
    assert splitter.flush(False) == ("", "<|ret")  # not an end after all: kept


def test_a_partial_header_at_the_end_is_kept_as_text():
    splitter = HarmonySplitter()
    assert splitter.push("<|channel|>fin") == ("", "")
    assert splitter.flush(False) == ("", "<|channel|>fin")


def test_headers_name_channel_and_recipient():
    assert message_kind("<|channel|>analysis")[1] == ""
    assert message_kind("<|channel|>commentary to=functions.f <|constrain|>json")[1] == (
        "functions.f"
    )
    assert message_kind("<|start|>assistant to=functions.g<|channel|>commentary json")[1] == (
        "functions.g"
    )
    assert message_kind("<|channel|>commentary to=assistant<|channel|>final")[1] == ""


def test_harmony_templates_are_told_by_their_channel_token():
    assert is_harmony_template(GPTOSS_TEMPLATE.read_text())
    assert not is_harmony_template(CHATML_TEMPLATE)


def test_a_rendered_call_parses_back():
    parser = HARMONY_DIALECT.parser(TOOLS)
    text = HARMONY_DIALECT.render_call("get_weather", WEATHER)
    splitter = HarmonySplitter()
    _, content = splitter.push(text[len("<|start|>assistant") :])
    parser.push(content)
    parser.finish()
    assert [(c.name, c.arguments) for c in parser.calls] == [("get_weather", WEATHER)]


# --- through ChoiceOutput, token by token (a byte-level tokenizer spells the markup) ---


def choice_output(tokenizer, tools=TOOLS, compelled=False):
    from engine.decoding.output import ChoiceOutput
    from engine.decoding.sampler import Sampler
    from engine.decoding.state import DecodeState
    from engine.types import GenerationRequest, SamplingParams

    request = GenerationRequest(
        request_id="r",
        prompt_ids=(1,),
        harmony=True,
        tool_dialect=HARMONY_DIALECT if tools else None,
        tools=tuple(tools),
        tool_compelled=compelled,
    )
    return ChoiceOutput(request, 0, tokenizer, DecodeState(Sampler(SamplingParams())))


def generate(out, tokenizer, text: str, ended: bool):
    events = [out.push(t)[0] for t in tokenizer.encode(text)]
    events.append(out.finish(ended_by_model=ended))
    events = [e for e in events if e is not None]
    reasoning = "".join(e.reasoning for e in events)
    content = "".join(e.text for e in events)
    deltas = [d for e in events for d in e.tool_calls]
    return reasoning, content, deltas


def test_choice_output_splits_a_harmony_answer(smollm2_tokenizer):
    out = choice_output(smollm2_tokenizer, tools=())
    reasoning, content, deltas = generate(out, smollm2_tokenizer, ANALYSIS + FINAL, True)
    assert (reasoning, content, deltas) == ("The user asks for 2+2. Easy: 4.", ANSWER, [])
    assert out.reasoning_tokens > 0
    assert out.finish_reason("stop") == "stop"


def test_choice_output_turns_a_call_the_model_ended_into_tool_calls(smollm2_tokenizer):
    # The model's <|call|> is its end of turn: never in the text, `ended_by_model` says so.
    out = choice_output(smollm2_tokenizer)
    reasoning, content, deltas = generate(out, smollm2_tokenizer, ANALYSIS + CALL, True)
    assert reasoning == "The user asks for 2+2. Easy: 4." and content == ""
    assert [type(d) for d in deltas] == [CallOpened, ArgumentsDelta]
    assert [(c.name, c.arguments) for c in out.parsed_calls] == [("get_weather", WEATHER)]
    assert out.finish_reason("stop") == "tool_calls"


def test_choice_output_leaves_a_call_cut_by_the_limit_incomplete(smollm2_tokenizer):
    out = choice_output(smollm2_tokenizer)
    generate(out, smollm2_tokenizer, ANALYSIS + CALL, False)
    assert out.parsed_calls == ()
    assert [e.code for e in out.call_errors] == ["incomplete_call"]
    assert out.finish_reason("length") == "length"
