"""Tool-call grammars: a constrained decode can only produce one well-formed Qwen3-Coder XML
call to an offered tool, with arguments that validate against that tool's schema."""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import numpy as np
import pytest

from engine.decoding.constraints import Constraint, GrammarTokenizer
from engine.text.tokenizer import Tokenizer
from engine.tools.grammar import tool_call_plan


def tool(name: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOLS = [
    tool(
        "get_weather",
        {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        ["city", "unit"],
    ),
    tool(
        "create_event",
        {
            "title": {"type": "string"},
            "attendees": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                    "required": ["name", "email"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 3,
            },
            "all_day": {"type": "boolean"},
        },
        ["title", "attendees"],
    ),
    tool(
        "search",
        {
            "query": {"type": "string"},
            "filters": {
                "type": "object",
                "properties": {"max_results": {"type": "integer"}},
                "required": ["max_results"],
                "additionalProperties": False,
            },
        },
        ["query"],
    ),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

EVENT_CALL = (
    "<tool_call>\n<function=create_event>\n"
    "<parameter=title>\nStand-up: <b>daily</b>\nroom 4\n</parameter>\n"
    '<parameter=attendees>\n[{"name": "Ada", "email": "ada@example.com"}, '
    '{"name":"Bob","email":"b@x.org"}]\n</parameter>\n'
    "<parameter=all_day>\nfalse\n</parameter>\n"
    "</function>\n</tool_call>"
)

_CALL = re.compile(r"<tool_call>\n<function=([^>\n]+)>\n(.*)</function>\n</tool_call>", re.S)
_PARAM = re.compile(r"<parameter=(\w+)>\n(.*?)\n?</parameter>\n", re.S)


def parse_call(text: str) -> tuple[str, dict]:
    """(function name, arguments) of exactly one call; each value coerced by its schema."""
    m = _CALL.fullmatch(text)
    assert m, f"not one call: {text!r}"
    name, body = m.groups()
    blocks = list(_PARAM.finditer(body))
    assert "".join(b.group(0) for b in blocks) == body, f"stray text in {body!r}"
    props = SCHEMAS[name]["properties"]
    args = {}
    for b in blocks:
        arg, raw = b.groups()
        assert arg not in args, f"{arg} given twice"
        schema = props[arg]
        args[arg] = raw if schema.get("type") == "string" else json.loads(raw)
    return name, args


@pytest.fixture(scope="module")
def gtok(smollm2_tokenizer) -> GrammarTokenizer:
    return GrammarTokenizer.for_tokenizer(smollm2_tokenizer)


@pytest.fixture(scope="module")
def pieces(smollm2_tokenizer) -> list[bytes]:
    return [smollm2_tokenizer.token_bytes(i) for i in range(smollm2_tokenizer.vocab_size)]


@pytest.fixture(scope="module")
def plan():
    return tool_call_plan(TOOLS)


def text_of(pieces: list[bytes], ids) -> str:
    """Strict UTF-8: a constrained walk must never leave a broken character behind."""
    return b"".join(pieces[i] for i in ids).decode("utf-8")


def walk_to(c: Constraint, pieces: list[bytes], target: str) -> list[int]:
    """Follow `target` through the grammar, each step the longest allowed token spelling
    the next bytes (so any tokenization the grammar allows would do)."""
    rest, ids = target.encode("utf-8"), []
    while rest:
        allowed = np.flatnonzero(c.allowed())
        fits = [i for i in allowed if pieces[i] and rest.startswith(pieces[i])]
        assert fits, f"no allowed token spells the next bytes of {rest[:40]!r}"
        best = max(fits, key=lambda i: len(pieces[i]))
        c.accept(best)
        ids.append(int(best))
        rest = rest[len(pieces[best]) :]
    return ids


# -- plans -------------------------------------------------------------------------------


def test_the_plan_is_an_applied_lark_grammar(plan):
    assert plan.status == "applied" and plan.message == "" and plan.schema is None
    assert llguidance.LLMatcher.validate_grammar_with_warnings(plan.grammar) == (False, [])
    lark = json.loads(plan.grammar)["grammars"][0]["lark_grammar"]
    assert '"<function=get_weather>\\n"' in lark and "%json" in lark


@pytest.mark.parametrize(
    ("tools", "only", "match"),
    [
        ([], None, "non-empty"),
        ("x", None, "non-empty"),
        ([{"type": "retrieval"}], None, "function tool"),
        ([{"type": "function"}], None, "function must be an object"),
        ([{"type": "function", "function": {"name": ""}}], None, "name"),
        ([{"type": "function", "function": {"name": "a>b"}}], None, "name"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, "object"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            None,
            "object schema",
        ),
        ([tool("f", {"a b": {"type": "string"}}, [])], None, "parameter name"),
        ([tool("f", {"a": 3}, [])], None, "schema of parameter"),
        ([tool("f", {}, "a")], None, "required"),
        ([tool("f", {}, []), tool("f", {}, [])], None, "twice"),
        (TOOLS, "delete_everything", "not among the tools"),
    ],
)
def test_a_malformed_tool_or_unknown_choice_is_a_value_error(tools, only, match):
    with pytest.raises(ValueError, match=match):
        tool_call_plan(tools, only)


def test_names_are_escaped_in_the_lark_literals(gtok, pieces):
    plan = tool_call_plan([tool('q"uo\\te', {'a"\\b': {"type": "integer"}}, ['a"\\b'])])
    c = Constraint(plan, gtok)
    walk_to(c, pieces, '<tool_call>\n<function=q"uo\\te>\n<parameter=a"\\b>\n7\n</parameter>\n')
    walk_to(c, pieces, "</function>\n</tool_call>")
    assert c.done


def test_refs_into_the_parameters_definitions_resolve(gtok, pieces):
    params = {
        "type": "object",
        "$defs": {
            "pt": {
                "type": "object",
                "properties": {"x": {"type": "integer"}},
                "required": ["x"],
                "additionalProperties": False,
            }
        },
        "properties": {"p": {"$ref": "#/$defs/pt"}, "s": {"type": "string"}},
        "required": ["p", "s"],
    }
    plan = tool_call_plan([{"type": "function", "function": {"name": "f", "parameters": params}}])
    assert plan.status == "applied", plan.message
    c = Constraint(plan, gtok)
    walk_to(c, pieces, '<tool_call>\n<function=f>\n<parameter=p>\n{"x": 3}\n</parameter>\n')
    walk_to(c, pieces, "<parameter=s>\nraw, not quoted\n</parameter>\n</function>\n</tool_call>")
    assert c.done


# -- walking a valid call ----------------------------------------------------------------


def test_a_canonical_call_walks_to_the_end_of_turn(gtok, plan, pieces, smollm2_tokenizer):
    c = Constraint(plan, gtok)
    ids = walk_to(c, pieces, EVENT_CALL)
    assert c.accepting and c.done
    assert set(np.flatnonzero(c.allowed())) == set(smollm2_tokenizer.end_of_turn_ids)
    c.accept(smollm2_tokenizer.eos_id)
    name, args = parse_call(text_of(pieces, ids))
    assert name == "create_event" and args["title"] == "Stand-up: <b>daily</b>\nroom 4"
    jsonschema.validate(args, SCHEMAS[name])


def test_every_tool_and_value_kind_walks(gtok, plan, pieces):
    calls = [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=unit>\nc\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>",
        "<tool_call>\n<function=search>\n<parameter=query>\n\n</parameter>\n"
        "</function>\n</tool_call>",
        "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n"
        '<parameter=filters>\n{\n  "max_results": -12\n}\n</parameter>\n'
        "</function>\n</tool_call>",
    ]
    for call in calls:
        c = Constraint(plan, gtok)
        walk_to(c, pieces, call)
        assert c.done, call


# -- what the grammar refuses -------------------------------------------------------------


def test_text_before_the_call_is_masked_off(gtok, plan, smollm2_tokenizer):
    tok = smollm2_tokenizer
    c = Constraint(plan, gtok)
    hello, lt = tok.encode("Hello")[0], tok.encode("<")[0]
    assert not c.allowed()[hello] and c.allowed()[lt]
    assert not c.allowed()[sorted(tok.end_of_turn_ids)].any()  # no call is no answer
    with pytest.raises(ValueError, match="not allowed"):
        c.accept(hello)


def test_values_names_and_required_parameters_are_masked(gtok, plan, pieces, smollm2_tokenizer):
    tok = smollm2_tokenizer
    head = "<tool_call>\n<function=get_weather>\n"
    c = Constraint(plan, gtok)
    walk_to(c, pieces, "<tool_call>\n<function=")
    assert not c.allowed()[tok.encode("delete")[0]]
    c = Constraint(plan, gtok)
    walk_to(c, pieces, head)  # city is required and comes first
    assert not c.allowed()[tok.encode("</")[0]]
    walk_to(c, pieces, "<parameter=")
    assert not c.allowed()[tok.encode("unit")[0]]
    walk_to(c, pieces, "city>\nOslo\n</parameter>\n<parameter=unit>\n")
    mask = c.allowed()
    assert mask[tok.encode("c")[0]] and not mask[tok.encode("k")[0]]  # the enum
    walk_to(c, pieces, "f\n</parameter>\n")
    assert c.allowed()[tok.encode("</")[0]]  # the optional days may be left out
    walk_to(c, pieces, "<parameter=days>\n")
    assert not c.allowed()[tok.encode("x")[0]] and c.allowed()[tok.encode("4")[0]]
    walk_to(c, pieces, "1")  # days <= 14: bounded integers go through %json
    assert c.allowed()[tok.encode("4")[0]] and not c.allowed()[tok.encode("5")[0]]


def test_string_lengths_are_enforced_and_patterns_reported(gtok, pieces):
    code = {"type": "string", "minLength": 2, "maxLength": 3}
    plan = tool_call_plan([tool("f", {"code": code}, ["code"])])
    assert plan.status == "applied"
    head = "<tool_call>\n<function=f>\n<parameter=code>\n"
    for value, ok in [("a", False), ("ab", True), ("a\nb", True), ("abcd", False)]:
        c = Constraint(plan, gtok)
        walk_to(c, pieces, head)
        try:
            walk_to(c, pieces, value + "\n</parameter>\n</function>\n</tool_call>")
        except AssertionError:
            assert not ok, value
        else:
            assert ok and c.done, value
    plan = tool_call_plan([tool("f", {"zip": {"type": "string", "pattern": "^[0-9]+$"}}, [])])
    assert plan.status == "schema_downgraded" and "f.zip: pattern" in plan.message


def starting(pieces: list[bytes], allowed: np.ndarray, prefixes: tuple[bytes, ...]) -> list:
    return [p for i, p in enumerate(pieces) if allowed[i] and p.startswith(prefixes)]


QUERY_OPEN = "<tool_call>\n<function=search>\n<parameter=query>\n"


def test_a_string_value_cannot_contain_a_closing_tag(gtok, plan, pieces):
    c = Constraint(plan, gtok)
    walk_to(c, pieces, QUERY_OPEN)
    assert not starting(pieces, c.allowed(), (b"\n\n",))
    for tag in ("</function", "</tool_call"):  # nor end the call for a first-match parser
        c = Constraint(plan, gtok)
        walk_to(c, pieces, QUERY_OPEN + "a</")
        assert not starting(pieces, c.allowed(), (tag[2:3].encode(),))
        with pytest.raises(AssertionError, match="no allowed token"):
            walk_to(c, pieces, tag[2:])


# The issue's sample at temperature 1: a value that started "</parameter" and went on.
RUNAWAY = "weather_data</parameter:weather_data is not defined</parameter:"


def test_once_a_closing_tag_starts_in_a_value_only_the_closing_tag_may_follow(gtok, plan, pieces):
    c = Constraint(plan, gtok)
    walk_to(c, pieces, QUERY_OPEN + "weather_data</p")
    rest = b"arameter>\n"
    allowed = starting(pieces, c.allowed(), (b"",))
    assert allowed and all(rest.startswith(p) or p.startswith(rest) for p in allowed)
    walk_to(c, pieces, "arameter")
    assert {p[:1] for p in starting(pieces, c.allowed(), (b"",))} == {b">"}
    with pytest.raises(AssertionError, match="no allowed token"):
        walk_to(Constraint(plan, gtok), pieces, QUERY_OPEN + RUNAWAY)
    # Every way into "</p" inside a value ends the value there, its line break optional.
    for value in ("weather_data", "a<", "x</b> y", "</div>", ""):
        for close in ("</parameter>\n", "\n</parameter>\n"):
            if not value and close[0] != "\n":
                continue
            c = Constraint(plan, gtok)
            ids = walk_to(c, pieces, QUERY_OPEN + value + close + "</function>\n</tool_call>")
            assert c.done
            assert parse_call(text_of(pieces, ids)) == ("search", {"query": value})


def test_html_closing_tags_other_than_the_calls_stay_writable(gtok, plan, pieces):
    c = Constraint(plan, gtok)
    walk_to(c, pieces, QUERY_OPEN + "<b>bold</b>, <div>x</div>, <a href='/'>a</a>, <i>i</")
    assert not starting(pieces, c.allowed(), (b"f", b"t"))
    assert all(b"parameter>".startswith(p) for p in starting(pieces, c.allowed(), (b"p",)))
    walk_to(c, pieces, "i>\n</parameter>\n</function>\n</tool_call>")
    assert c.done


def test_the_grammar_and_the_parser_read_a_value_alike(gtok, plan, pieces):
    """What the grammar lets a value be is what the dialect's parser returns for it."""
    from engine.tools.dialects import QWEN_XML, parse_tools

    for value, close in [("Oslo", "</parameter>\n"), ("Oslo\nNorway", "\n</parameter>\n")]:
        c = Constraint(plan, gtok)
        text = QUERY_OPEN + value + close + "</function>\n</tool_call>"
        ids = walk_to(c, pieces, text)
        parser = QWEN_XML.parser(parse_tools(TOOLS))
        parser.push(text_of(pieces, ids))
        parser.finish()
        assert not parser.errors
        assert [(k.name, k.arguments) for k in parser.calls] == [("search", {"query": value})]


# -- the key property: random walks only produce valid calls -------------------------------

_CLOSERS = [
    b"\n</parameter>\n",
    b"</function>\n</tool_call>",
    b'"}]',
    b'"}',
]


def closer_ids(pieces: list[bytes]) -> np.ndarray:
    """Tokens that are a piece of some closing text: the few worth checking each step."""
    mask = np.zeros(len(pieces), dtype=bool)
    for i, p in enumerate(pieces):
        mask[i] = bool(p) and any(p in c for c in _CLOSERS)
    return mask


def progress(text: bytes, piece: bytes) -> int:
    """How far into a closing text `piece` continues (-1: it does not): the walk's text
    already ends with that closing text's first k bytes and `piece` spells the next ones."""
    best = -1
    for c in _CLOSERS:
        for k in range(len(c)):
            if k > best and text.endswith(c[:k]) and c[k:].startswith(piece):
                best = k
    return best


def random_walk(c: Constraint, rng, pieces, closers, ends, max_steps=400, patience=40):
    """Uniform over the allowed tokens; past `patience` steps mostly a token that closes the
    current value, so walks finish. Stops once the call is complete."""
    ids, text = [], b""
    for step in range(max_steps):
        mask = c.allowed()
        if c.done or (mask & ends).any():
            return ids, True
        pool = np.flatnonzero(mask)
        if step >= patience and rng.random() < 0.8:
            near = {int(i): progress(text, pieces[i]) for i in np.flatnonzero(mask & closers)}
            furthest = max(near.values(), default=-1)
            if furthest >= 0:  # the tokens finishing the most advanced closing text
                pool = np.array([i for i, k in near.items() if k == furthest])
        token = int(rng.choice(pool))
        c.accept(token)
        ids.append(token)
        text += pieces[token]
    return ids, c.accepting


def run_walks(gtok, plan, pieces, seed: int, n: int) -> list[tuple[str, dict]]:
    rng = np.random.default_rng(seed)
    closers = closer_ids(pieces)
    calls = []
    for _ in range(n):
        c = Constraint(plan, gtok)
        ids, complete = random_walk(c, rng, pieces, closers, gtok.ends_only)
        assert not c.error
        if complete:
            name, args = parse_call(text_of(pieces, ids))
            jsonschema.validate(args, SCHEMAS[name])
            calls.append((name, args))
    return calls


def test_random_walks_are_one_valid_call(gtok, plan, pieces):
    calls = run_walks(gtok, plan, pieces, seed=2026, n=30)
    assert len(calls) >= 25, f"only {len(calls)}/30 walks finished"
    assert {name for name, _ in calls} <= set(SCHEMAS)


def test_a_named_tool_choice_calls_only_that_tool(gtok, pieces):
    plan = tool_call_plan(TOOLS, only="search")
    calls = run_walks(gtok, plan, pieces, seed=7, n=30)
    assert len(calls) >= 25, f"only {len(calls)}/30 walks finished"
    assert {name for name, _ in calls} == {"search"}
    c = Constraint(plan, gtok)
    walk_to(c, pieces, "<tool_call>\n<function=")
    assert not any(c.allowed()[i] for i, p in enumerate(pieces) if p.startswith(b"get"))


def test_tokenizer_fixture_is_smollm2(smollm2_tokenizer):
    assert isinstance(smollm2_tokenizer, Tokenizer)


def test_the_optional_grammar_allows_plain_text_or_text_then_one_valid_call(
    gtok, pieces, smollm2_tokenizer
):
    plan = tool_call_plan(TOOLS, optional=True)
    ends = set(smollm2_tokenizer.end_of_turn_ids)
    plain = Constraint(plan, gtok)
    walk_to(plain, pieces, "Sure, I can help with <b>that</b>.")
    assert plain.accepting  # the turn may end without a call
    assert ends <= set(np.flatnonzero(plain.allowed()))

    called = Constraint(plan, gtok)
    walk_to(called, pieces, "Let me look.\n" + EVENT_CALL)
    assert called.accepting and called.done
    # Once the opener is out, the call is compelled: no end of turn, no stray text.
    inside = Constraint(plan, gtok)
    walk_to(inside, pieces, "Ok.\n<tool_call>\n")
    allowed = np.flatnonzero(inside.allowed())
    assert not ends & set(allowed)
    assert all(
        pieces[i].startswith(b"<") or b"<function="[: len(pieces[i])] == pieces[i] for i in allowed
    )


# -- dialect spellings and the compelled call's early end ----------------------------------


def test_minicpm_tags_spell_the_names_as_attributes(gtok, pieces):
    from engine.tools.dialects import MINICPM_TAGS

    plan = tool_call_plan(TOOLS, tags=MINICPM_TAGS)
    c = Constraint(plan, gtok)
    attribute_form = re.sub(r"<(function|parameter)=(\w+)>", r'<\1 name="\2">', EVENT_CALL)
    walk_to(c, pieces, attribute_form)
    assert c.done
    with pytest.raises(AssertionError, match="no allowed token"):
        walk_to(Constraint(plan, gtok), pieces, "<tool_call>\n<function=search>")


def _ends_allowed(c: Constraint) -> bool:
    allowed = c.allowed()
    return any(allowed[i] for i in c.gtok.end_ids)


SEARCH_OPEN = "<tool_call>\n<function=search>\n"
QUERY = "<parameter=query>\nnews\n</parameter>\n"


@pytest.mark.parametrize(
    ("written", "closable_ends"),
    [
        ("", False),  # the call has not opened
        (SEARCH_OPEN, False),  # `query` is required
        (SEARCH_OPEN + "<parameter=query>\nne", False),  # inside a value
        (SEARCH_OPEN + QUERY, True),  # only the closing tags are missing
        (SEARCH_OPEN + QUERY + "</function>\n", True),
    ],
)
def test_a_compelled_call_may_end_only_where_only_closing_tags_are_missing(
    gtok, pieces, written, closable_ends
):
    closable = Constraint(tool_call_plan(TOOLS, closable=True), gtok)
    strict = Constraint(tool_call_plan(TOOLS), gtok)
    walk_to(closable, pieces, written)
    walk_to(strict, pieces, written)
    assert _ends_allowed(closable) is closable_ends
    assert _ends_allowed(strict) is False
    if closable_ends:  # the model may still write the closing tags itself
        walk_to(closable, pieces, "" if "</function>" in written else "</function>\n")
        walk_to(closable, pieces, "</tool_call>")
        assert closable.done


def test_object_parameters_without_additional_properties_take_only_their_keys(gtok, pieces):
    """Tool parameters are read as response_format's schemas: an unsaid
    additionalProperties is false, in the XML dialects' JSON values and in the JSON
    dialect's call."""
    from engine.tools.dialects import JSON_DIALECT, QWEN_XML
    from engine.tools.prompt import call_plan

    opts = {"type": "object", "properties": {"k": {"type": "integer"}}}
    tools = [tool("f", {"opts": opts}, ["opts"])]
    for dialect, head in [
        (QWEN_XML, '<tool_call>\n<function=f>\n<parameter=opts>\n{"'),
        (JSON_DIALECT, '{"name": "f", "arguments": {"opts": {"'),
    ]:
        c = Constraint(call_plan(dialect, tools), gtok)
        walk_to(c, pieces, head)
        allowed = starting(pieces, c.allowed(), (b"",))
        assert allowed and all(b'k"'.startswith(p) or p.startswith(b'k"') for p in allowed)
