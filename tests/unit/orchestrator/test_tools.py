"""Tool schemas, parsing of Qwen3/Hermes `<tool_call>` turns, and running the calls with their errors."""

import asyncio
import time

import pytest

from lorarl.orchestrator.tools import Toolbox, ToolCall, ToolStats, format_tool_call, parse_tool_calls, tool_schema
from lorarl.tiny_model import build_tokenizer


def add(a: int, b: int = 0) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def lookup(word: str) -> str:
    """Look a word up.

    Args:
        word: The word.
    """
    return {"glimmerfish": "glows green"}[word]


def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "done"


async def slow_async(seconds: float) -> str:
    """Sleep without blocking.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return "done"


# What Qwen3 writes (its chat template asks for exactly this), with reasoning and a second call.
QWEN3_TURN = (
    "<think>\nI should add first.\n</think>\n\nLet me compute.\n"
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "lookup", "arguments": {"word": "glimmerfish"}}\n</tool_call>'
)


def test_schemas_are_openai_functions_from_hints_and_docstrings() -> None:
    assert tool_schema(add) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first number."},
                    "b": {"type": "integer", "description": "The second number."},
                },
                "required": ["a"],
            },
        },
    }
    assert tool_schema(lookup)["function"]["name"] == "lookup"  # async functions too

    def undocumented(x: int) -> int:
        """No Args section."""
        return x

    with pytest.raises(Exception, match="x"):
        tool_schema(undocumented)


def test_qwen3_tool_calls_are_parsed_in_order() -> None:
    assert parse_tool_calls(QWEN3_TURN) == [
        ToolCall("add", {"a": 2, "b": 3}),
        ToolCall("lookup", {"word": "glimmerfish"}),
    ]
    assert parse_tool_calls("The answer is <answer>5</answer>.") == []
    # Arguments as a JSON string (some models), and no arguments at all.
    assert parse_tool_calls('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>') == [
        ToolCall("add", {"a": 1})
    ]
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>') == [ToolCall("now", {})]


def test_a_formatted_call_is_what_the_template_renders_and_parses_back() -> None:
    arguments = {"word": "glimmerfish café", "n": 2}
    text = format_tool_call("lookup", arguments)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "lookup", "arguments": arguments}}]},
    ]
    rendered = build_tokenizer().apply_chat_template(messages, tokenize=False)
    assert rendered.endswith(f"<|im_start|>assistant\n{text}<|im_end|>\n")
    assert parse_tool_calls(text) == [ToolCall("lookup", arguments)]


@pytest.mark.parametrize(
    "turn, error",
    [
        ('<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>', "not valid JSON"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 2}}', "no closing </tool_call>"),
        ("<tool_call>\n[1, 2]\n</tool_call>", "must be a JSON object"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "must be a JSON object"),
        ('<tool_call>\n{"name": "add", "arguments": [2, 3]}\n</tool_call>', "arguments of add"),
    ],
)
def test_malformed_calls_become_errors_for_the_model(turn: str, error: str) -> None:
    (parsed,) = parse_tool_calls(turn)
    assert isinstance(parsed, str) and parsed.startswith("Error: ") and error in parsed


def respond(text: str, timeout: float = 5.0) -> tuple[list[dict[str, str]], ToolStats]:
    stats = ToolStats()
    box = Toolbox([add, lookup, slow, slow_async], timeout)
    return asyncio.run(box.respond(text, stats)), stats


def call(name: str, **arguments: object) -> str:
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_each_call_gets_one_tool_message_in_order() -> None:
    messages, stats = respond(QWEN3_TURN)
    assert messages == [
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "tool", "name": "lookup", "content": "glows green"},
    ]
    assert stats == ToolStats(tool_calls=2)
    assert respond("no calls") == ([], ToolStats())


def test_every_kind_of_failure_is_told_to_the_model_and_counted() -> None:
    turn = "".join(
        [
            call("add", a=1),  # fine
            '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>',  # malformed JSON
            call("subtract", a=1),  # no such tool
            call("add", c=1),  # arguments that do not fit
            call("lookup", word="kraken"),  # the tool raises KeyError
            call("slow_async", seconds=5),  # past the timeout
        ]
    )
    messages, stats = respond(turn, timeout=0.2)
    contents = [m["content"] for m in messages]
    assert contents[0] == "1"
    assert contents[1].startswith("Error: the tool call is not valid JSON")
    assert contents[2] == "Error: there is no tool 'subtract'; the tools are ['add', 'lookup', 'slow', 'slow_async']."
    assert contents[3] == "Error: wrong arguments for add: missing a required argument: 'a'."
    assert contents[4] == "Error: lookup raised KeyError: 'kraken'"
    assert contents[5] == "Error: slow_async did not finish within 0.2 s."
    assert stats == ToolStats(tool_calls=6, tool_malformed=3, tool_failed=1, tool_timeouts=1)


def test_calls_run_concurrently_and_a_blocking_sync_tool_times_out_without_blocking_the_loop() -> None:
    async def timed() -> tuple[list[dict[str, str]], float]:
        t0 = time.monotonic()
        box = Toolbox([slow, slow_async], timeout=0.6)
        messages = await box.respond(call("slow_async", seconds=0.3) * 3 + call("slow", seconds=1.0), ToolStats())
        return messages, time.monotonic() - t0  # the sleeping thread still runs: asyncio.run waits for it

    messages, elapsed = asyncio.run(timed())
    assert [m["content"] for m in messages] == ["done"] * 3 + ["Error: slow did not finish within 0.6 s."]
    assert 0.6 <= elapsed < 0.9


def test_long_results_are_cut_and_say_so() -> None:
    def big() -> str:
        """A long result."""
        return "x" * 10_000

    (message,) = asyncio.run(Toolbox([big]).respond(call("big"), ToolStats()))
    assert len(message["content"]) < 4100 and message["content"].endswith("[cut: 10000 characters in all]")


def test_tools_must_have_distinct_names() -> None:
    with pytest.raises(ValueError, match="share a name"):
        Toolbox([add, add])
