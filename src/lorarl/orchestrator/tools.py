"""Tool calling as the chat template means it: schemas in, `<tool_call>` JSON out, `tool` messages back.

Tools are plain Python functions (sync or async) with type hints and a Google-style docstring
(`Args:`); transformers' `get_json_schema` turns each into the OpenAI-style schema that chat
templates render from `tools=`. The model answers in its family's format; Qwen3, Qwen2.5 and
Hermes models write one JSON object per call:

    <tool_call>
    {"name": "search", "arguments": {"query": "glimmerfish"}}
    </tool_call>

We parse it here rather than with vLLM's Hermes parser, which turns the whole turn back into plain
content as soon as one call is malformed (and logs a traceback): RL needs every call judged on its
own, each mistake answered to the model and counted. Every call gets exactly one `tool` message, in
order, so templates that pair results with calls by position (Qwen3) stay right. A malformed call,
an unknown tool, arguments that do not fit, a tool that raises and one that runs past its timeout
all become an "Error: ..." message, never an exception out of the episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import get_json_schema

ToolFunc = Callable[..., Any]
"""A tool: a Python function (sync or `async def`) with type hints and an `Args:` docstring."""

log = logging.getLogger("lorarl.orchestrator")

# A closed call, or one left open at the end of the turn (the model ran out of tokens), as vLLM's
# Hermes parser reads them.
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)
# Longest tool result shown to the model, in characters; longer ones are cut (and say so).
MAX_RESULT_CHARS = 4000


def tool_schema(func: ToolFunc) -> dict[str, Any]:
    """The OpenAI-style `{"type": "function", "function": {name, description, parameters}}` of
    `func`; a missing type hint or an undocumented argument is an error naming it."""
    schema = get_json_schema(func)
    schema["function"].pop("return", None)  # not part of the OpenAI format, and templates print it all
    return schema


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """One call as the model writes it, and as Qwen3's template renders an assistant message's
    `tool_calls` (JSON with ", " and ": ", non-ASCII kept): what warm-up data teaches, and what
    `parse_tool_calls` reads back."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def parse_tool_calls(text: str) -> list[ToolCall | str]:
    """Every `<tool_call>` of a model turn, in order: a ToolCall, or for a malformed one the
    error to show the model."""
    return [_parse_one(m.group(1)) for m in TOOL_CALL.finditer(text)]


def _parse_one(body: str | None) -> ToolCall | str:
    if body is None:  # only the second, unclosed alternative matched
        return "Error: the tool call has no closing </tool_call> tag."
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return f"Error: the tool call is not valid JSON ({e.msg} at character {e.pos})."
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'Error: a tool call must be a JSON object {"name": <tool name>, "arguments": {...}}.'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return f"Error: the arguments of {call['name']} must be a JSON object."
    return ToolCall(call["name"], arguments)


@dataclass
class ToolStats:
    """What the tool calls of an episode came to; each logged per episode as env/<env>/<field>."""

    tool_calls: int = 0  # calls the model wrote, well-formed or not
    tool_malformed: int = 0  # not valid JSON, no closing tag, unknown tool, arguments that do not fit
    tool_failed: int = 0  # the tool raised
    tool_timeouts: int = 0  # the tool ran past its timeout

    def as_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in vars(self).items()}


@dataclass
class Toolbox:
    """The tools of an environment: their schemas for the template, and running a turn's calls."""

    tools: list[ToolFunc]
    timeout: float = 10.0  # seconds per call
    # One per tool, in order; empty: read from the functions' type hints and docstrings (tool_schema).
    schemas: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.schemas = self.schemas or [tool_schema(f) for f in self.tools]
        self.by_name = {s["function"]["name"]: f for s, f in zip(self.schemas, self.tools, strict=True)}
        if len(self.by_name) != len(self.tools):
            raise ValueError(f"two tools share a name: {[s['function']['name'] for s in self.schemas]}")

    async def respond(self, text: str, stats: ToolStats) -> list[dict[str, str]]:
        """One `tool` message per call in the model turn `text` (none: no calls), counting in `stats`."""
        calls = parse_tool_calls(text)
        stats.tool_calls += len(calls)
        results = await asyncio.gather(*(self._run(call, stats) for call in calls))
        return [
            {"role": "tool", "name": call.name if isinstance(call, ToolCall) else "", "content": result}
            for call, result in zip(calls, results, strict=True)
        ]

    async def _run(self, call: ToolCall | str, stats: ToolStats) -> str:
        if isinstance(call, str):
            stats.tool_malformed += 1
            return call
        func = self.by_name.get(call.name)
        if func is None:
            stats.tool_malformed += 1
            return f"Error: there is no tool {call.name!r}; the tools are {sorted(self.by_name)}."
        try:
            inspect.signature(func).bind(**call.arguments)
        except TypeError as e:
            stats.tool_malformed += 1
            return f"Error: wrong arguments for {call.name}: {e}."
        try:
            result = await asyncio.wait_for(self._call(func, call.arguments), self.timeout)
        except TimeoutError:
            stats.tool_timeouts += 1
            return f"Error: {call.name} did not finish within {self.timeout:g} s."
        except Exception as e:
            stats.tool_failed += 1
            log.debug("tool %s raised", call.name, exc_info=True)
            return f"Error: {call.name} raised {type(e).__name__}: {e}"
        return _as_text(result)

    @staticmethod
    async def _call(func: ToolFunc, arguments: dict[str, Any]) -> Any:
        """Async tools are awaited; sync ones run in a thread, so a slow one cannot stall the other
        episodes (a thread cannot be killed: past its timeout it is only no longer waited for)."""
        if inspect.iscoroutinefunction(func):
            return await func(**arguments)
        return await asyncio.to_thread(func, **arguments)


def _as_text(result: Any) -> str:
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    if len(text) > MAX_RESULT_CHARS:
        return text[:MAX_RESULT_CHARS] + f"... [cut: {len(text)} characters in all]"
    return text
