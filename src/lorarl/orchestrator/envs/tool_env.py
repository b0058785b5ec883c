"""`ToolEnvironment`: a multi-turn environment whose replies are the results of the model's tool calls.

List the tools (Python functions with type hints and an `Args:` docstring, sync or async) in
`tools`; the chat template shows them to the model (`tools=`), each `<tool_call>` the model writes
is run (tools.py) and answered with a `tool` message, and a turn without calls ends the episode:
that turn is the answer. Each episode's calls are counted (`ToolStats`) and logged with its
rewards as env/<env>/tool_calls, tool_malformed, tool_failed and tool_timeouts (means per episode).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from lorarl.orchestrator.envs.base import Environment, Episode, Message
from lorarl.orchestrator.tools import Toolbox, ToolFunc, ToolStats


def used_tools(episode: Episode) -> float:
    """1 if the model made at least one well-formed tool call: a reward function to log with weight 0."""
    stats = episode.state.get("tool_stats", ToolStats())
    return float(stats.tool_calls > stats.tool_malformed)


class ToolEnvironment(Environment):
    """An environment whose model calls the Python functions listed in `tools` (see the module
    docstring); a turn without a tool call ends the episode and is its answer."""

    max_turns = 4
    tools: list[ToolFunc] = []
    tool_timeout: float = 10.0  # seconds per call; past it the model is told the call timed out

    @cached_property
    def toolbox(self) -> Toolbox:
        """Built on first use, so that subclasses may set `tools` in __init__ (bound methods too)."""
        return Toolbox(list(self.tools), self.tool_timeout)

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return self.toolbox.schemas

    async def env_response(self, episode: Episode) -> list[Message] | None:
        """The results of the last turn's tool calls; None (the episode ends) if it made none."""
        stats = episode.state.setdefault("tool_stats", ToolStats())
        return await self.toolbox.respond(episode.completion, stats) or None

    async def score(self, episode: Episode) -> dict[str, float]:
        """The rewards, and the episode's tool call counts (logged with weight 0)."""
        return await super().score(episode) | episode.state.get("tool_stats", ToolStats()).as_metrics()
