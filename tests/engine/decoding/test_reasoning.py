"""Think blocks: the prompt suffix for enable_thinking, the reasoning/content splitter
(any chunking of an answer splits the same way) and the reasoning budget."""

from __future__ import annotations

import itertools
import re

import pytest

from engine.decoding.reasoning import (
    THINK_CLOSE,
    THINK_OPEN,
    ReasoningBudget,
    ReasoningSplitter,
    is_think_template,
    thinking_prompt_suffix,
)
from engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate

# --- the prompt suffix ------------------------------------------------------------------

CHATML_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def qwen3_template(reference_dir, gguf_kv) -> ChatTemplate:
    path = reference_dir / "tiny" / "tiny-qwen3.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return ChatTemplate.from_gguf(gguf_kv(path))


def test_think_templates_are_told_apart_by_their_think_tag(qwen3_template):
    assert is_think_template(qwen3_template.source)
    assert not is_think_template(CHATML_TEMPLATE)


def test_a_plain_prompt_gets_an_open_block_or_a_closed_empty_one():
    assert thinking_prompt_suffix(CHATML_PROMPT, True) == "<think>\n"
    assert thinking_prompt_suffix(CHATML_PROMPT, False) == "<think>\n\n</think>\n\n"


def test_a_block_the_template_opened_is_kept_open_or_closed():
    opened = CHATML_PROMPT + "<think>\n"
    assert thinking_prompt_suffix(opened, True) == ""
    assert opened + thinking_prompt_suffix(opened, False) == (
        CHATML_PROMPT + "<think>\n\n</think>\n\n"
    )
    bare = CHATML_PROMPT + "<think>"
    assert bare + thinking_prompt_suffix(bare, False) == CHATML_PROMPT + "<think>\n\n</think>\n\n"


def test_a_block_the_template_closed_needs_nothing():
    closed = CHATML_PROMPT + "<think>\n\n</think>\n\n"
    assert thinking_prompt_suffix(closed, False) == ""
    assert thinking_prompt_suffix(closed, True) == ""  # the template's decision stands
    tight = CHATML_PROMPT + "<think></think>"
    assert thinking_prompt_suffix(tight, False) == "\n\n"


def test_an_earlier_turns_think_block_does_not_count():
    history = "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nYes.<|im_end|>\n" + CHATML_PROMPT
    assert thinking_prompt_suffix(history, True) == "<think>\n"
    assert thinking_prompt_suffix(history, False) == "<think>\n\n</think>\n\n"


def test_qwen3_prompts_end_inside_or_after_the_think_block(qwen3_template):
    messages = [{"role": "user", "content": "Hi"}]
    off = qwen3_template.render(messages, enable_thinking=False)
    assert off.endswith("<think>\n\n</think>\n\n")
    assert thinking_prompt_suffix(off, False) == ""
    on = qwen3_template.render(messages, enable_thinking=True)
    assert on.endswith("<|im_start|>assistant\n")
    assert thinking_prompt_suffix(on, True) == "<think>\n"


# --- the splitter -----------------------------------------------------------------------

# (started_inside, answer text, reasoning, content, in_think at the end, closed at the end)
CORPUS = [
    # no think block
    (False, "Hello there!", "", "Hello there!", False, False),
    (False, "  \nHi", "", "  \nHi", False, False),
    (False, "   ", "", "   ", False, False),
    (False, "", "", "", False, False),
    (False, "<thinking>yes", "", "<thinking>yes", False, False),
    (False, "<thi", "", "<thi", False, False),
    (False, "x<think>y</think>z", "", "x<think>y</think>z", False, False),
    # opened by the prompt
    (
        True,
        "Let me think.\n</think>\n\nThe answer is 4.",
        "Let me think.\n",
        "The answer is 4.",
        False,
        True,
    ),
    (True, "", "", "", True, False),
    (True, "思考する</think>答え", "思考する", "答え", False, True),
    # <think> at the start of the answer
    (False, "<think>\nhmm\n</think>\n\nYes.", "\nhmm\n", "Yes.", False, True),
    (False, "\n <think>a</think>b", "a", "b", False, True),
    # unclosed at the end: all reasoning, a partial close tag included
    (True, "still thinking </thi", "still thinking </thi", "", True, False),
    (False, "<think>abc", "abc", "", True, False),
    (True, "a </thin k> b</think>c", "a </thin k> b", "c", False, True),
    # text after the close; whitespace inside the content is kept
    (True, "r</think>\n\nline1\n\nline2  ", "r", "line1\n\nline2  ", False, True),
    (True, "r</think>\n\n", "r", "", False, True),
    # <think> later in the content stays content
    (
        False,
        "Answer: <think>not a block</think> ok",
        "",
        "Answer: <think>not a block</think> ok",
        False,
        False,
    ),
    (True, "r</think>x <think>y</think>", "r", "x <think>y</think>", False, True),
    (False, "<think>r</think>\n\nx <think>", "r", "x <think>", False, True),
    # empty think blocks
    (False, "<think></think>Hi", "", "Hi", False, True),
    (False, "<think>\n\n</think>\n\nHi", "\n\n", "Hi", False, True),
    (True, "</think>\n\nHi", "", "Hi", False, True),
]


def split(started_inside: bool, pieces) -> tuple[str, str, ReasoningSplitter]:
    splitter = ReasoningSplitter(started_inside=started_inside)
    reasoning, content = [], []
    for piece in pieces:
        r, c = splitter.push(piece)
        reasoning.append(r)
        content.append(c)
    r, c = splitter.flush()
    return "".join(reasoning) + r, "".join(content) + c, splitter


def token_like(text: str) -> list[str]:
    """Pieces shaped like BPE tokens: the tags come apart into "<", "/", "think", ">"."""
    return re.findall(r"\s+|\w+|[^\w\s]", text)


def chunkings(text: str):
    yield [text]
    yield list(text)
    yield token_like(text)
    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        yield [text[:i], text[i:j], text[j:]]


@pytest.mark.parametrize(
    ("started_inside", "text", "reasoning", "content", "in_think", "closed"), CORPUS
)
def test_every_chunking_splits_the_same_way(
    started_inside, text, reasoning, content, in_think, closed
):
    for pieces in chunkings(text):
        r, c, splitter = split(started_inside, pieces)
        assert (r, c) == (reasoning, content), pieces
        assert (splitter.in_think, splitter.closed) == (in_think, closed), pieces


def test_a_tag_split_across_pushes_is_held_back_until_known():
    splitter = ReasoningSplitter(started_inside=True)
    assert splitter.push("abc</th") == ("abc", "")
    assert splitter.in_think
    assert splitter.push("ink>") == ("", "")
    assert not splitter.in_think and splitter.closed
    assert splitter.push("\n") == ("", "")  # the gap after the close is dropped
    assert splitter.push("\nd") == ("", "d")
    assert splitter.flush() == ("", "")


def test_text_that_only_looked_like_an_open_tag_is_released_as_content():
    splitter = ReasoningSplitter()
    assert splitter.push(" <thi") == ("", "")
    assert splitter.push("s is it") == ("", " <this is it")
    assert not splitter.in_think and not splitter.closed


def test_an_open_tag_at_the_start_opens_the_block():
    splitter = ReasoningSplitter()
    assert splitter.push("<think>") == ("", "")
    assert splitter.in_think
    assert splitter.push("x") == ("x", "")


# --- the budget -------------------------------------------------------------------------

CLOSE = [10, 11, 12]


def test_the_close_sequence_is_forced_after_exactly_n_reasoning_tokens_once():
    budget = ReasoningBudget(3, CLOSE)
    for _ in range(3):
        assert budget.forced() == []
        budget.on_token(in_think=True)
    assert budget.forced() == CLOSE
    for _ in range(5):
        assert budget.forced() == []
        budget.on_token(in_think=True)


def test_tokens_outside_the_think_block_do_not_count():
    budget = ReasoningBudget(2, CLOSE)
    for _ in range(10):
        budget.on_token(in_think=False)
    assert budget.forced() == []
    budget.on_token(in_think=True)
    assert budget.forced() == []
    budget.on_token(in_think=True)
    assert budget.forced() == CLOSE


@pytest.mark.parametrize("n", [0, -1])
def test_a_budget_of_zero_or_less_is_unlimited(n):
    budget = ReasoningBudget(n, CLOSE)
    for _ in range(100):
        budget.on_token(in_think=True)
        assert budget.forced() == []


def test_the_forced_close_ends_the_reasoning_for_the_splitter():
    """The engine loop in miniature: forced text goes through the splitter like sampled text."""
    vocab = {1: "I ", 2: "think ", 10: "\n", 11: THINK_CLOSE, 12: "\n\n", 5: "Done."}
    sampled = iter([1, 2, 2, 2, 2, 5])
    splitter = ReasoningSplitter(started_inside=True)
    budget = ReasoningBudget(3, CLOSE)
    reasoning, content, ids = "", "", []
    while len(ids) < 8:
        step = budget.forced() or [next(sampled)]
        for token in step:
            ids.append(token)
            r, c = splitter.push(vocab[token])
            reasoning, content = reasoning + r, content + c
            budget.on_token(splitter.in_think)
    r, c = splitter.flush()
    assert ids == [1, 2, 2, 10, 11, 12, 2, 2]
    assert (reasoning + r, content + c) == ("I think think \n", "think think ")
    assert THINK_OPEN not in content and splitter.closed
