"""Tool-call dialects: parsing a corpus of answers the same way however they are chunked
(whole, one character at a time, every 2-way split), arguments typed from the schema,
failed calls reported and never shown as content, and render_call round trips."""

from __future__ import annotations

import json
import re

import pytest

from engine.tools.dialects import (
    JSON_DIALECT,
    MINICPM_XML,
    QWEN_XML,
    ArgumentsDelta,
    CallClosed,
    CallOpened,
    TextDelta,
    ToolSpec,
    dialect_for,
    parse_tools,
)

TOOLS = parse_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "days": {"type": "integer"},
                        "metric": {"type": "boolean"},
                    },
                    "required": ["city"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "plot",
                "description": "Plot points.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "points": {"type": "array"},
                        "style": {"type": "object"},
                        "scale": {"type": "number"},
                        "title": {"type": ["string", "null"]},
                    },
                },
            },
        },
    ]
)


def _fold(events, parser):
    """What a client keeps from the events: calls (no ids), content; checks event rules."""
    opened: dict[int, CallOpened] = {}
    args: dict[int, str] = {}
    calls, content = [], ""
    for ev in events:
        if isinstance(ev, TextDelta):
            assert ev.text
            content += ev.text
        elif isinstance(ev, CallOpened):
            assert ev.index not in opened and re.fullmatch(r"call_[0-9a-f]{24}", ev.id)
            opened[ev.index], args[ev.index] = ev, ""
        elif isinstance(ev, ArgumentsDelta):
            args[ev.index] += ev.text
        else:
            assert isinstance(ev, CallClosed)
            assert opened[ev.index].id == ev.call.id and opened[ev.index].name == ev.call.name
            assert args[ev.index] == json.dumps(ev.call.arguments)
            calls.append((ev.call.name, ev.call.arguments))
    assert content == parser.content
    assert calls == [(c.name, c.arguments) for c in parser.calls]
    errors = [(e.code, e.function, e.parameter) for e in parser.errors]
    return calls, errors, content


def _run(dialect, text, chunks):
    parser = dialect.parser(TOOLS)
    events = []
    for chunk in chunks:
        events += parser.push(chunk)
    events += parser.finish()
    return _fold(events, parser)


def _chunkings(text):
    yield [text]
    yield list(text)
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]


def _xml(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


WEATHER = _xml("get_weather", city="Paris", days="3")
PLOT = _xml(
    "plot",
    points="[[1, 2], [3, 4]]",
    style='{"color": "red", "dash": [1, 2]}',
    scale="2.5",
    title="null",
)

# (name, text, calls, error codes with function/parameter, content)
XML_CORPUS = [
    ("plain", "Hello, world.\nNo tools here.", [], [], "Hello, world.\nNo tools here."),
    (
        "text_then_call",
        "Let me look.\n\n" + WEATHER,
        [("get_weather", {"city": "Paris", "days": 3})],
        [],
        "Let me look.",
    ),
    (
        "typed_nested",
        PLOT,
        [
            (
                "plot",
                {
                    "points": [[1, 2], [3, 4]],
                    "style": {"color": "red", "dash": [1, 2]},
                    "scale": 2.5,
                    "title": None,
                },
            )
        ],
        [],
        "",
    ),
    (
        "two_calls",
        WEATHER + "\n" + _xml("get_weather", city="Rome", metric="false"),
        [
            ("get_weather", {"city": "Paris", "days": 3}),
            ("get_weather", {"city": "Rome", "metric": False}),
        ],
        [],
        "",
    ),
    (
        "text_between",
        "First.\n" + WEATHER + "\nThen Rome.\n" + _xml("get_weather", city="Rome"),
        [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Rome"})],
        [],
        "First.Then Rome.",
    ),
    (
        "multiline_string_and_unknown_param",
        _xml("get_weather", city="\nNew\nYork\n", note="  x < y  "),
        [("get_weather", {"city": "\nNew\nYork\n", "note": "  x < y  "})],
        [],
        "",
    ),
    (
        "cut_in_parameter",
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        [],
        [("incomplete_call", "get_weather", "city")],
        "Checking.",
    ),
    (
        "cut_in_function_tag",
        "Checking.\n<tool_call>\n<function=get_wea",
        [],
        [("incomplete_call", None, None)],
        "Checking.",
    ),
    ("cut_in_opener", "Checking.\n<tool_c", [], [("incomplete_call", None, None)], "Checking."),
    (
        "cut_after_a_call",
        WEATHER + "\n<tool_call>\n<function=plot>\n",
        [("get_weather", {"city": "Paris", "days": 3})],
        [("incomplete_call", "plot", None)],
        "",
    ),
    (
        "missing_function_close",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>\nok",
        [],
        [("malformed_call", "get_weather", None)],
        "ok",
    ),
    (
        "bad_integer",
        _xml("get_weather", city="Paris", days="three") + "\n" + _xml("get_weather", city="Oslo"),
        [("get_weather", {"city": "Oslo"})],
        [("invalid_argument", "get_weather", "days")],
        "",
    ),
    (
        "junk_inside_call",
        "<tool_call>\nhello</tool_call>done",
        [],
        [("malformed_call", None, None)],
        "done",
    ),
    (
        "lookalikes",
        "I like <tool things> and a<b. Use the <function=x> tag",
        [],
        [],
        "I like <tool things> and a<b. Use the <function=x> tag",
    ),
    ("ends_with_lt", "a < b and b<", [], [], "a < b and b<"),
    (
        "unknown_function",
        _xml("launch", target="moon") + "\n" + WEATHER,
        [("get_weather", {"city": "Paris", "days": 3})],
        [("unknown_function", "launch", None)],
        "",
    ),
]

J_WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
JSON_CORPUS = [
    ("plain", "Hello {there}. `code` and ```py\nx\n```", [], [], None),
    (
        "text_then_bare",
        "Let me look.\n" + J_WEATHER,
        [("get_weather", {"city": "Paris", "days": 3})],
        [],
        "Let me look.",
    ),
    (
        "fenced",
        "Sure.\n```json\n" + J_WEATHER + "\n```\nDone.",
        [("get_weather", {"city": "Paris", "days": 3})],
        [],
        "Sure.Done.",
    ),
    (
        "fenced_two_calls",
        '```json\n{"function": "get_weather", "arguments": {"city": "Rome"}}\n'
        + J_WEATHER
        + "\n```",
        [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Paris", "days": 3})],
        [],
        "",
    ),
    (
        "typed_nested",
        '{"name": "plot", "arguments": {"points": [[1, 2]], "style": {"c": "}"}, "scale": "2"}}',
        [("plot", {"points": [[1, 2]], "style": {"c": "}"}, "scale": 2})],
        [],
        "",
    ),
    (
        "bare_two_calls_text_between",
        J_WEATHER + "\nand\n" + '{"name": "plot", "arguments": "{\\"scale\\": 1}"}',
        [("get_weather", {"city": "Paris", "days": 3}), ("plot", {"scale": 1})],
        [],
        "and",
    ),
    (
        "never_closes",
        'Ok.\n{"name": "get_weather", "arguments": {"city": "Par',
        [],
        [("incomplete_call", "get_weather", None)],
        "Ok.",
    ),
    (
        "never_closes_fenced",
        '```json\n{"name": "plot", "arguments": {',
        [],
        [("incomplete_call", "plot", None)],
        "",
    ),
    ("cut_in_key", 'Ok. {"na', [], [("incomplete_call", None, None)], "Ok."),
    (
        "not_a_call_object",
        'Here:\n{"name": "Bob", "age": 3}\n```json\n{"name": "x", "k": 1}\n```',
        [],
        [],
        'Here:\n{"name": "Bob", "age": 3}\n```json\n{"name": "x", "k": 1}\n```',
    ),
    (
        "unknown_function",
        '{"name": "launch", "arguments": {}}' + J_WEATHER,
        [("get_weather", {"city": "Paris", "days": 3})],
        [("unknown_function", "launch", None)],
        "",
    ),
    (
        "bad_integer",
        '{"name": "get_weather", "arguments": {"city": "P", "days": "x"}}',
        [],
        [("invalid_argument", "get_weather", "days")],
        "",
    ),
    (
        "invalid_json",
        '{"name": "get_weather", "arguments": {city: 1}} after',
        [],
        [("malformed_call", "get_weather", None)],
        "after",
    ),
]


def _attribute_form(text: str) -> str:
    """A Qwen XML answer in MiniCPM's spelling: <function name="N">, <parameter name="A">."""
    return re.sub(
        r"<(function|parameter)=([^<>\n]*)(>?)",
        lambda m: f'<{m[1]} name="{m[2]}' + ('">' if m[3] else ""),
        text,
    )


def _minicpm_case(case):
    name, text, calls, errors, content = case
    content = content if content is None else _attribute_form(content)
    return pytest.param(MINICPM_XML, _attribute_form(text), calls, errors, content, id=name)


@pytest.mark.parametrize(
    "dialect,text,calls,errors,content",
    [pytest.param(QWEN_XML, *case[1:], id="xml-" + case[0]) for case in XML_CORPUS]
    + [_minicpm_case((f"minicpm-{c[0]}", *c[1:])) for c in XML_CORPUS]
    + [pytest.param(JSON_DIALECT, *case[1:], id="json-" + case[0]) for case in JSON_CORPUS],
)
def test_it_parses_the_same_however_the_answer_is_chunked(dialect, text, calls, errors, content):
    results = {repr(_run(dialect, text, chunks)) for chunks in _chunkings(text)}
    assert len(results) == 1, results
    got_calls, got_errors, got_content = _run(dialect, text, [text])
    assert got_calls == calls
    assert got_errors == errors
    assert got_content == (text if content is None else content)
    if dialect is not JSON_DIALECT:
        for tag in ("<tool_call>", "</tool_call>", dialect.tags.parameter, "</parameter>"):
            assert tag not in got_content


def test_it_holds_markup_back_until_it_is_known():
    parser = QWEN_XML.parser(TOOLS)
    assert parser.push("Hi \n<tool_") == [TextDelta("Hi")]
    events = parser.push("call>\n<function=get_weather>")
    assert [type(e) for e in events] == [CallOpened] and parser.content == "Hi"
    parser = QWEN_XML.parser(TOOLS)
    assert parser.push("Hi \n<tool_") == [TextDelta("Hi")]
    assert parser.push("s>") == [TextDelta(" \n<tool_s>")]


def test_whitespace_is_content_except_next_to_a_call():
    parser = QWEN_XML.parser(TOOLS)
    parser.push("Line\n")
    assert parser.finish() == [TextDelta("\n")] and parser.content == "Line\n"


def test_a_call_that_fails_after_opening_never_closes():
    parser = QWEN_XML.parser(TOOLS)
    events = parser.push(_xml("get_weather", city="Paris", days="x") + WEATHER) + parser.finish()
    assert [(type(e).__name__, getattr(e, "index", None)) for e in events] == [
        ("CallOpened", 0),
        ("ArgumentsDelta", 0),
        ("CallOpened", 1),
        ("ArgumentsDelta", 1),
        ("ArgumentsDelta", 1),
        ("ArgumentsDelta", 1),
        ("CallClosed", 1),
    ]
    assert [e.code for e in parser.errors] == ["invalid_argument"]


def test_it_opens_a_call_as_soon_as_the_function_is_known():
    parser = QWEN_XML.parser(TOOLS)
    events = parser.push("<tool_call>\n<function=get_weather>\n<parameter=city>\nPa")
    assert [type(e) for e in events] == [CallOpened]
    events = parser.push("ris\n</parameter>\n")
    assert events == [ArgumentsDelta(0, '{"city": "Paris"')]
    events = parser.push("</function>\n</tool_call>")
    assert [type(e) for e in events] == [ArgumentsDelta, CallClosed]


ROUND_TRIP_ARGS = [
    {},
    {"city": "Paris"},
    {"city": "line one\nline two", "days": 4, "metric": True},
    {"points": [[1, 2]], "style": {"a": {"b": None}}, "scale": 0.5, "title": None},
    {"title": "é ü \u2603"},
]


XML_DIALECTS = [QWEN_XML, MINICPM_XML]
ALL_DIALECTS = [*XML_DIALECTS, JSON_DIALECT]
DIALECT_IDS = ["xml", "minicpm", "json"]


@pytest.mark.parametrize("dialect", ALL_DIALECTS, ids=DIALECT_IDS)
@pytest.mark.parametrize("arguments", ROUND_TRIP_ARGS)
def test_a_rendered_call_parses_back(dialect, arguments):
    name = "plot" if "points" in arguments or "title" in arguments else "get_weather"
    text = dialect.render_call(name, arguments)
    for chunks in ([text], list(text)):
        parser = dialect.parser(TOOLS)
        for chunk in chunks:
            parser.push(chunk)
        parser.finish()
        assert [(c.name, c.arguments) for c in parser.calls] == [(name, arguments)]
        assert parser.errors == [] and parser.content == ""


@pytest.mark.parametrize("dialect", ALL_DIALECTS, ids=DIALECT_IDS)
def test_system_text_names_every_tool_and_the_syntax(dialect):
    text = dialect.system_text(TOOLS)
    for tool in TOOLS:
        assert tool.name in text
        assert json.dumps(tool.parameters) in text
    syntax = {
        QWEN_XML: "<tool_call>\n<function=",
        MINICPM_XML: '<tool_call>\n<function name="get_weather">\n</function>',
        JSON_DIALECT: '{"name": ',
    }[dialect]
    assert syntax in text


def test_render_result():
    assert QWEN_XML.render_result("42", "f") == "<tool_response>\n42\n</tool_response>"
    assert json.loads(JSON_DIALECT.render_result("42", "f")) == {"name": "f", "content": "42"}


def test_dialect_is_chosen_by_served_name_and_architecture():
    assert dialect_for("ornith-7b") is JSON_DIALECT
    assert dialect_for("ornith-7b", "llama", True) is JSON_DIALECT
    assert dialect_for("qwen3-coder") is QWEN_XML
    assert dialect_for("my-ornith") is QWEN_XML
    assert dialect_for("minicpm5", "llama", template_adds_bos=True) is MINICPM_XML
    assert dialect_for("smollm2", "llama", template_adds_bos=False) is QWEN_XML
    assert dialect_for("qwen3", "qwen3", template_adds_bos=True) is QWEN_XML


@pytest.mark.parametrize("dialect", XML_DIALECTS, ids=["xml", "minicpm"])
@pytest.mark.parametrize(
    "written,closing",
    [
        ("", None),  # before the call opens: nothing to close
        ("<tool_call>\n", None),  # no function yet
        ("<tool_call>\nFUNC\nPARAM\nPar", None),  # inside a value
        ("<tool_call>\nFUNC\n", "</function>\n</tool_call>"),
        ("<tool_call>\nFUNC\nPARAM\nParis\n</parameter>\n", "</function>\n</tool_call>"),
        ("<tool_call>\nFUNC\nPARAM\nParis\n</parameter>\n</function>\n", "</tool_call>"),
        ("<tool_call>\nFUNC\nPARAM\nParis\n</parameter>\n</funct", None),
    ],
)
def test_closing_text_closes_a_call_only_where_only_closing_tags_are_missing(
    dialect, written, closing
):
    written = written.replace("FUNC", dialect.tags.function_tag("get_weather"))
    written = written.replace("PARAM", dialect.tags.parameter_tag("city"))
    parser = dialect.parser(TOOLS)
    parser.push(written)
    assert parser.closing_text() == closing
    if closing is not None:
        parser.push(closing)
        parser.finish()
        assert [c.name for c in parser.calls] == ["get_weather"] and parser.errors == []


def test_json_calls_are_never_closed_by_the_server():
    parser = JSON_DIALECT.parser(TOOLS)
    parser.push('{"name": "get_weather", "arguments": {"city": "Paris"}')
    assert parser.closing_text() is None


def test_parse_tools_accepts_openai_entries():
    (spec,) = parse_tools([{"type": "function", "function": {"name": "f"}}])
    assert spec == ToolSpec("f", "", {"type": "object", "properties": {}})


@pytest.mark.parametrize(
    "tools,message",
    [
        ({"type": "function"}, "must be a list"),
        (["f"], r"tools\[0\] must be an object"),
        ([{"type": "retrieval", "function": {"name": "f"}}], "type must be 'function'"),
        ([{"type": "function"}], "function must be an object"),
        ([{"type": "function", "function": {"name": "a b"}}], "name must be"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], "parameters"),
        ([{"type": "function", "function": {"name": "f", "description": 3}}], "description"),
        (
            [{"type": "function", "function": {"name": "f"}}] * 2,
            r"tools\[1\].function.name 'f' is given twice",
        ),
    ],
)
def test_parse_tools_rejects_malformed_entries(tools, message):
    with pytest.raises(ValueError, match=message):
        parse_tools(tools)
