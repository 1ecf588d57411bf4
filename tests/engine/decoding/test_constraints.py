"""Structured output: response_format plans, llguidance masks over real vocabularies, and the
key property that a constrained decode can only produce schema-valid JSON."""

from __future__ import annotations

import json
import time

import jsonschema
import numpy as np
import pytest

from engine.decoding.constraints import (
    Constraint,
    ConstraintPlan,
    GrammarTokenizer,
    closed_objects,
    fill_masks,
    plan_response_format,
    validate_output,
)
from engine.text.tokenizer import Tokenizer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["x", "y", "z"]},
            "minItems": 1,
            "maxItems": 3,
        },
        "role": {"enum": ["admin", "user", None]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
        "score": {"type": ["number", "null"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
ADA = '{"name": "Ada", "age": 36, "tags": ["x"]}'


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def gtok(smollm2_tokenizer) -> GrammarTokenizer:
    return GrammarTokenizer.for_tokenizer(smollm2_tokenizer)


@pytest.fixture(scope="module")
def person_plan() -> ConstraintPlan:
    return plan_response_format(json_schema(PERSON))


def text_of(tok: Tokenizer, ids) -> str:
    """Strict UTF-8: a constrained walk must never leave a broken character behind."""
    return b"".join(tok.token_bytes(int(i)) for i in ids).decode("utf-8")


def walk(constraint: Constraint, ids) -> None:
    for i in ids:
        assert constraint.allowed()[i], f"token {i} refused"
        constraint.accept(i)


# -- plans -------------------------------------------------------------------------------


def test_text_and_none_are_unconstrained():
    for rf in (None, {"type": "text"}):
        plan = plan_response_format(rf)
        assert (plan.status, plan.grammar, plan.schema) == ("text", None, None)


def test_json_object_is_any_object():
    plan = plan_response_format({"type": "json_object"})
    assert plan.status == "applied" and plan.grammar
    assert plan.schema == {"type": "object"}


def test_json_schema_is_applied_with_the_clients_schema():
    plan = plan_response_format(json_schema(PERSON))
    assert plan.status == "applied" and plan.message == ""
    assert plan.schema == PERSON and plan.grammar


def test_an_unknown_type_is_ignored_and_says_so():
    plan = plan_response_format({"type": "yaml"})
    assert plan.status == "ignored_unknown_type" and plan.grammar is None
    assert "yaml" in plan.message


@pytest.mark.parametrize(
    "rf",
    [
        "json_object",
        {},
        {"type": 3},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": "x"},
        {"type": "json_schema", "json_schema": {"name": "t"}},
        {"type": "json_schema", "json_schema": {"name": "t", "schema": [1]}},
        {"type": "json_schema", "json_schema": {"name": "t", "schema": True}},
        {"type": "json_schema", "json_schema": {"name": 5, "schema": {}}},
        {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}},
        json_schema({"type": "strnig"}),
        json_schema({"type": "object", "properties": {"a": {"minLength": "3"}}}),
    ],
)
def test_a_malformed_response_format_is_a_value_error(rf):
    with pytest.raises(ValueError, match="response_format"):
        plan_response_format(rf)


@pytest.mark.parametrize(
    ("schema", "feature"),
    [
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "properties": {"c": {"type": "string", "format": "color"}}}, "color"),
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        ({"type": "string", "pattern": "^(?=a)a+$"}, "look-around"),
        # A schema's own x-guidance cannot switch llguidance to silently ignoring keywords.
        ({"x-guidance": {"lenient": True}, "type": "array", "uniqueItems": True}, "uniqueItems"),
    ],
)
def test_an_unsupported_feature_downgrades_and_names_it(schema, feature):
    plan = plan_response_format(json_schema(schema))
    assert plan.status == "schema_downgraded"
    assert feature in plan.message
    # validated against what was asked (its objects closed)
    assert plan.grammar and plan.schema == closed_objects(schema)


def test_a_downgraded_schema_still_enforces_the_rest(gtok, smollm2_tokenizer):
    tok = smollm2_tokenizer
    plan = plan_response_format(
        json_schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    )
    c = Constraint(plan, gtok)
    walk(c, tok.encode("[1, 1"))
    assert not c.allowed()[tok.encode('"')[0]]
    walk(c, tok.encode("]"))
    assert c.done
    ok, why = validate_output(plan, "[1, 1]")  # the dropped keyword is caught afterwards
    assert not ok and "unique" in why


def test_an_inexpressible_pattern_falls_back_to_the_type(gtok, smollm2_tokenizer):
    plan = plan_response_format(json_schema({"type": "string", "pattern": "^(?=a)a+$"}))
    assert "enforcing only" in plan.message
    c = Constraint(plan, gtok)
    assert c.allowed()[smollm2_tokenizer.encode('"')[0]]
    assert not c.allowed()[smollm2_tokenizer.encode("{")[0]]


# -- objects are closed unless the schema says otherwise ---------------------------------

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp": {"type": "number"}},
    "required": ["city"],
}


@pytest.mark.parametrize(
    ("schema", "closed"),
    [
        (CITY, {**CITY, "additionalProperties": False}),
        # every nesting level: properties, items, anyOf branches, $defs
        (
            {
                "type": "object",
                "properties": {
                    "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                    "l": {"type": "array", "items": {"properties": {"x": {}}}},
                    "u": {"anyOf": [{"properties": {"y": {}}}, {"type": "null"}]},
                    "r": {"$ref": "#/$defs/R"},
                },
                "$defs": {"R": {"properties": {"z": {}}}},
            },
            {
                "type": "object",
                "properties": {
                    "a": {
                        "type": "object",
                        "properties": {"b": {"type": "integer"}},
                        "additionalProperties": False,
                    },
                    "l": {
                        "type": "array",
                        "items": {"properties": {"x": {}}, "additionalProperties": False},
                    },
                    "u": {
                        "anyOf": [
                            {"properties": {"y": {}}, "additionalProperties": False},
                            {"type": "null"},
                        ]
                    },
                    "r": {"$ref": "#/$defs/R"},
                },
                "$defs": {"R": {"properties": {"z": {}}, "additionalProperties": False}},
                "additionalProperties": False,
            },
        ),
        # explicit values are kept; an object without properties stays any object
        ({**CITY, "additionalProperties": True}, {**CITY, "additionalProperties": True}),
        (
            {**CITY, "additionalProperties": {"type": "integer"}},
            {**CITY, "additionalProperties": {"type": "integer"}},
        ),
        ({**CITY, "unevaluatedProperties": False}, {**CITY, "unevaluatedProperties": False}),
        ({"type": "object"}, {"type": "object"}),
        (
            {"type": "array", "items": {"type": "object"}},
            {"type": "array", "items": {"type": "object"}},
        ),
        # parts of one object are closed as a whole: any part's keys, no others
        (
            {
                "allOf": [{"properties": {"a": {}}}, {"$ref": "#/$defs/B"}],
                "$defs": {"B": {"properties": {"b": {}}}},
            },
            {
                "allOf": [{"properties": {"a": {}}}, {"$ref": "#/$defs/B"}],
                "$defs": {"B": {"properties": {"b": {}}}},
                "properties": {"a": {}, "b": {}},
                "additionalProperties": False,
            },
        ),
        # a part that admits other keys leaves the whole open; "not" is never narrowed
        (
            {"allOf": [{"properties": {"a": {}}}, {"additionalProperties": True}]},
            {"allOf": [{"properties": {"a": {}}}, {"additionalProperties": True}]},
        ),
        ({"not": {"properties": {"a": {}}}}, {"not": {"properties": {"a": {}}}}),
    ],
)
def test_objects_without_additional_properties_are_closed(schema, closed):
    before = json.dumps(schema)
    assert closed_objects(schema) == closed
    assert json.dumps(schema) == before  # the client's schema is not changed
    if closed != schema:  # the plan's grammar and its final check use the closed schema
        assert plan_response_format(json_schema(schema)).schema == closed


def test_an_unsaid_additional_properties_is_false_in_the_grammar_and_the_check(
    gtok, smollm2_tokenizer
):
    tok = smollm2_tokenizer
    nested = {"type": "object", "properties": {"where": CITY}, "required": ["where"]}
    for schema, head in [(CITY, '{"city": "Oslo", "'), (nested, '{"where": {"city": "Oslo", "')]:
        plan = plan_response_format(json_schema(schema))
        c = Constraint(plan, gtok)
        walk(c, tok.encode(head))
        allowed = [tok.token_bytes(int(i)) for i in np.flatnonzero(c.allowed())]
        assert allowed and all(b"temp".startswith(p) or p.startswith(b"temp") for p in allowed)
        close = "}" * head.count("{")
        ok, why = validate_output(plan, head + 'x": 1' + close)
        assert not ok and "Additional properties are not allowed" in why, why
        assert validate_output(plan, head + 'temp": 1' + close) == (True, "")
    plan = plan_response_format(json_schema({**CITY, "additionalProperties": True}))
    c = Constraint(plan, gtok)
    walk(c, tok.encode('{"city": "Oslo", "x": [1]}'))
    assert c.accepting and validate_output(plan, '{"city": "Oslo", "x": [1]}')[0]


# -- walking a grammar token by token ----------------------------------------------------


def test_every_token_of_a_valid_value_is_allowed(gtok, person_plan, smollm2_tokenizer):
    tok = smollm2_tokenizer
    c = Constraint(person_plan, gtok)
    assert not c.accepting
    walk(c, tok.encode(ADA))
    assert c.done and c.accepting
    # Complete: only the end-of-turn ids remain.
    assert set(np.flatnonzero(c.allowed())) == set(tok.end_of_turn_ids)
    c.accept(tok.eos_id)
    assert validate_output(person_plan, ADA) == (True, "")


def test_nested_pretty_printed_values_walk_too(gtok, person_plan, smollm2_tokenizer):
    value = {
        "name": "Grace Hopper",
        "age": 85,
        "tags": ["y", "z"],
        "role": None,
        "address": {"city": "Arlington", "zip": "22201"},
        "score": -1.5e3,
        "active": True,
    }
    c = Constraint(person_plan, gtok)
    walk(c, smollm2_tokenizer.encode(json.dumps(value, indent=2)))
    assert c.done


def test_an_invalid_token_is_masked_off_and_refused(gtok, person_plan, smollm2_tokenizer):
    tok = smollm2_tokenizer
    c = Constraint(person_plan, gtok)
    walk(c, tok.encode('{"name": "Ada", "age": '))
    letter, digit = tok.encode("x")[0], tok.encode("3")[0]
    mask = c.allowed()
    assert not mask[letter] and mask[digit]
    with pytest.raises(ValueError, match="not allowed"):
        c.accept(letter)
    walk(c, tok.encode('36, "tags": ["x"]}'))  # a refused token leaves the matcher usable
    assert c.done


def test_enums_bounds_and_required_keys_are_masked(gtok, person_plan, smollm2_tokenizer):
    tok = smollm2_tokenizer
    c = Constraint(person_plan, gtok)
    walk(c, tok.encode('{"name": "Ada", "age": 36, "tags": ["'))
    allowed = {text_of(tok, [i]) for i in np.flatnonzero(c.allowed())}
    assert allowed <= {"x", "y", "z", 'x"', 'y"', 'z"', 'x"]', 'y"]', 'z"]', 'x",', 'y",', 'z",'}
    c = Constraint(person_plan, gtok)
    walk(c, tok.encode('{"name": "Ada", "age": 15'))
    assert c.allowed()[tok.encode("0")[0]] and not c.allowed()[tok.encode("1")[0]]  # <= 150
    c = Constraint(person_plan, gtok)
    walk(c, tok.encode('{"name": "Ada"'))
    assert not c.allowed()[tok.encode("}")[0]]  # "age" is required


def test_special_tokens_never_appear_inside_a_value(gtok, person_plan, smollm2_tokenizer):
    tok = smollm2_tokenizer
    c = Constraint(person_plan, gtok)
    walk(c, tok.encode('{"name": "'))
    mask = c.allowed()
    assert not mask[sorted(tok.special_ids)].any()
    assert mask.sum() > 40_000  # but any ordinary text


# -- the key property: a constrained decode only produces valid output -------------------


def closing_tokens(tok: Tokenizer) -> np.ndarray:
    marks = (b'"', b"]", b"}")
    return np.array([any(m in tok.token_bytes(i) for m in marks) for i in range(tok.vocab_size)])


def random_walk(c: Constraint, rng, closers: np.ndarray, ends: np.ndarray, max_steps=200):
    """Uniform over the allowed tokens, leaning on ones that close a string or a container so
    most walks finish; stops when the value is complete (an end token is allowed)."""
    ids = []
    for _ in range(max_steps):
        mask = c.allowed()
        if c.done or (mask & ends).any():
            return ids, True
        pool = np.flatnonzero(mask & closers)
        if pool.size == 0 or rng.random() < 0.4:
            pool = np.flatnonzero(mask)
        token = int(rng.choice(pool))
        c.accept(token)
        ids.append(token)
    return ids, c.accepting


def test_random_constrained_walks_always_validate(gtok, person_plan, smollm2_tokenizer):
    tok = smollm2_tokenizer
    rng = np.random.default_rng(1234)
    closers, ends = closing_tokens(tok), gtok.ends_only
    validator = jsonschema.Draft202012Validator(PERSON)
    finished = 0
    for _ in range(50):
        c = Constraint(person_plan, gtok)
        ids, complete = random_walk(c, rng, closers, ends)
        text = text_of(tok, ids)
        if complete:
            finished += 1
            validator.validate(json.loads(text))
            assert validate_output(person_plan, text) == (True, "")
        else:  # cut short, like max_tokens: reported, never passed off as valid
            assert not c.error
            assert validate_output(person_plan, text)[0] is False
    assert finished >= 40, f"only {finished}/50 walks finished"


def test_json_object_walks_parse_to_dicts(gtok, smollm2_tokenizer):
    tok = smollm2_tokenizer
    plan = plan_response_format({"type": "json_object"})
    rng = np.random.default_rng(7)
    closers, ends = closing_tokens(tok), gtok.ends_only
    finished = 0
    for _ in range(30):
        c = Constraint(plan, gtok)
        ids, complete = random_walk(c, rng, closers, ends)
        if complete:
            finished += 1
            assert isinstance(json.loads(text_of(tok, ids)), dict)
    assert finished >= 20


# -- validation and batching --------------------------------------------------------------


def test_validate_output_cases():
    text_plan = plan_response_format(None)
    assert validate_output(text_plan, "not json") == (True, "")
    obj = plan_response_format({"type": "json_object"})
    assert validate_output(obj, ' {"a": [1, {}]} ') == (True, "")
    assert validate_output(obj, "[1]")[0] is False
    ok, why = validate_output(obj, '{"a": [1, ')
    assert not ok and "not valid JSON" in why
    person = plan_response_format(json_schema(PERSON))
    ok, why = validate_output(person, '{"name": "Ada", "age": 200, "tags": ["x"]}')
    assert not ok and "age" in why
    ok, why = validate_output(person, '{"name": "Ada", "age": 3, "tags": ["q"]}')
    assert not ok and "tags/0" in why


def test_validate_output_honours_the_schemas_own_draft_and_formats():
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "string"}],  # draft-07 tuple form, not a 2020-12 schema
    }
    plan = plan_response_format(json_schema(draft7))
    assert validate_output(plan, '["a", 1]') == (True, "")
    assert validate_output(plan, "[1]")[0] is False
    ipv4 = ConstraintPlan("applied", schema={"type": "string", "format": "ipv4"})
    assert validate_output(ipv4, '"10.0.0.1"') == (True, "")
    assert validate_output(ipv4, '"999.0.0.1"')[0] is False


def test_validate_output_never_fetches_a_remote_ref():
    plan = ConstraintPlan("applied", schema={"$ref": "https://example.invalid/s.json"})
    ok, why = validate_output(plan, "{}")
    assert not ok and "cannot be resolved" in why


def test_fill_masks_equals_each_allowed(gtok, person_plan, smollm2_tokenizer):
    tok = smollm2_tokenizer
    prefixes = ['{"name": "', '{"name": "Ada", "age": 4', "", ADA, '{"name": "A", "age": 1, "']

    def at(prefix: str) -> Constraint:
        c = Constraint(person_plan, gtok)
        walk(c, tok.encode(prefix))
        return c

    batch = [at(p) for p in prefixes]
    masks = fill_masks([*batch[:2], None, *batch[2:]])
    assert masks[2] is None
    del masks[2]
    for prefix, mask in zip(prefixes, masks, strict=True):
        expected = at(prefix).allowed()
        assert mask.shape == (tok.vocab_size,) and mask.dtype == bool
        np.testing.assert_array_equal(mask, expected)
    assert fill_masks([]) == []


def test_the_grammar_tokenizer_is_built_once_per_tokenizer(smollm2_tokenizer, gtok):
    assert GrammarTokenizer.for_tokenizer(smollm2_tokenizer) is gtok
    assert gtok.vocab_size == smollm2_tokenizer.vocab_size == 49152


def test_mask_timing(gtok, person_plan, smollm2_tokenizer):
    """Printed, not asserted: per-token mask cost on SmolLM2's 49152-token vocabulary."""
    tok = smollm2_tokenizer
    value = json.dumps(
        {"name": "Grace", "age": 85, "tags": ["y"], "address": {"city": "Paris"}}, indent=2
    )
    ids = tok.encode(value)
    t0 = time.perf_counter()
    plan = plan_response_format(json_schema(PERSON))
    t_plan = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = Constraint(plan, gtok)
    t_new = time.perf_counter() - t0
    single = []
    for i in ids:
        t0 = time.perf_counter()
        c.allowed()
        single.append(time.perf_counter() - t0)
        c.accept(i)
    batch = [Constraint(plan, gtok) for _ in range(8)]
    batched = []
    for i in ids:
        t0 = time.perf_counter()
        fill_masks(batch)
        batched.append(time.perf_counter() - t0)
        for b in batch:
            b.accept(i)
    ms = 1e3
    print(
        f"\nplan {t_plan * ms:.2f} ms, matcher {t_new * ms:.2f} ms; allowed() over {len(ids)} "
        f"tokens: mean {np.mean(single) * ms:.3f} ms, max {np.max(single) * ms:.3f} ms; "
        f"fill_masks x8: mean {np.mean(batched) * ms:.3f} ms, max {np.max(batched) * ms:.3f} ms"
    )


# -- a SentencePiece vocabulary -----------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3_tokenizer(gemma3_path, gguf_kv) -> Tokenizer:
    return Tokenizer.from_gguf(gguf_kv(gemma3_path))


def test_gemma3_sentencepiece_vocab_constrains_too(gemma3_tokenizer, person_plan):
    tok = gemma3_tokenizer
    t0 = time.perf_counter()
    g = GrammarTokenizer.for_tokenizer(tok)
    print(f"\ngemma3 GrammarTokenizer: {time.perf_counter() - t0:.2f} s, {g.vocab_size} tokens")
    # Gemma's user-defined pieces ("\n", runs of spaces, "<td>") are text, not specials.
    value = {"name": "Ada <td>", "age": 36, "tags": ["x", "y"], "address": {"city": "Köln"}}
    for text in (json.dumps(value, ensure_ascii=False), json.dumps(value, indent=2)):
        c = Constraint(person_plan, g)
        t0 = time.perf_counter()
        walk(c, ids := tok.encode(text))
        per_token = (time.perf_counter() - t0) / len(ids)
        print(f"gemma3 mask + accept: {per_token * 1e3:.3f} ms per token over {len(ids)} tokens")
        assert c.done
        assert set(np.flatnonzero(c.allowed())) == set(tok.end_of_turn_ids)
    c = Constraint(person_plan, g)
    walk(c, tok.encode('{"name": "'))
    mask = c.allowed()
    assert not mask[sorted(tok.end_of_turn_ids)].any()
    assert not mask[tok.token_id("<start_of_turn>")]


def test_forced_text_is_tokenized_without_the_sentencepiece_space_prefix():
    """llguidance tokenizes the bytes a grammar forces through our encode; a vocabulary that
    prepends "▁" must still hand back ids spelling exactly those bytes."""
    pieces = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab", "{", "}", '"', ":", "▁{"]
    pieces += ["1", *(f"<0x{b:02X}>" for b in range(256))]
    types = [3, 3, 3] + [1] * 12 + [6] * 256
    scores = [0.0] * 3 + [-float(i) for i in range(12)] + [0.0] * 256
    tok = Tokenizer(
        pieces, [], types, model="llama", scores=scores, add_space_prefix=True, bos_id=1, eos_id=2
    )
    assert tok.token_bytes(tok.encode('{"ab')[0]) == b" {"  # the prefix is there
    g = GrammarTokenizer.for_tokenizer(tok)
    for text in ("ab", '{"ab": 1}', " ab", "\n"):
        assert g.ll.decode_bytes(g.ll.tokenize_str(text)) == text.encode()
    plan = plan_response_format(
        json_schema({"type": "object", "properties": {"ab": {"type": "integer"}}})
    )
    c = Constraint(plan, g)
    walk(c, [9, 11, 7, 11, 12, 3, 14, 10])  # {"ab": 1}
    assert c.done and set(np.flatnonzero(c.allowed())) == {2}
