"""verifiers tool servers (`vf.Toolset`) called in-process, as the tools of a lorarl `Toolbox`.

verifiers 0.4 launches each toolset as an MCP server program, per rollout (`Task.toolsets`) or per
run (`Taskset.toolsets`), and its harness program calls the tools over HTTP. lorarl samples every
model turn itself (episodes.py), so it calls the toolset's `@vf.tool` methods directly, with what
the MCP server would have done around them: the schemas are the ones it advertises (MCP's own
function metadata; names prefixed with the server name, as verifiers' harnesses list them), the
arguments are validated by the same pydantic model, and the toolset's `state` is the episode's
`trace.state`, which verifiers syncs over its state channel, so the task's rewards read what the
tools recorded. A rollout's toolsets are built fresh for each episode and set up for its task
(`setup`, `setup_task`); a taskset's are built and set up once. A toolset that runs somewhere else
(a `url`, a container runtime) or serves more than its `@vf.tool` methods is refused by `check`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

import verifiers.v1 as vf
from mcp.server.mcpserver.tools.base import Tool as McpTool
from verifiers.v1.mcp.server import _call_state  # whose `state` a tool call sees, as verifiers isolates calls
from verifiers.v1.utils.decorators import discover_decorated

from lorarl.orchestrator.tools import Toolbox, ToolFunc


def check(toolsets: Sequence[object], owner: str) -> None:
    """Refuse, in one line, a toolset lorarl cannot call in-process."""
    for toolset in toolsets:
        name = type(toolset).__name__
        if not isinstance(toolset, vf.Toolset) or type(toolset).register is not vf.Toolset.register:
            raise ValueError(
                f"{owner}: its tool server {name} is not a vf.Toolset of @vf.tool methods, "
                "the only kind lorarl runs (in-process)"
            )
        runtime = getattr(toolset.config, "runtime", None)
        if getattr(toolset.config, "url", None) or not isinstance(runtime, vf.SubprocessConfig | None):
            where = getattr(toolset.config, "url", None) or f"a {runtime.type} runtime"  # type: ignore[union-attr]
            raise ValueError(f"{owner}: its tool server {name} runs in {where}; lorarl runs tool servers in-process")


def mcp_tools(toolset: vf.Toolset[Any, Any]) -> list[McpTool]:
    """The toolset's tools as its MCP server registers them, under the names the model sees."""
    prefix = toolset.server_name
    tools = []
    for fn in discover_decorated(toolset, "tool"):
        name = getattr(fn, "tool_name", None) or fn.__name__
        full = f"{prefix}_{name}" if prefix else name
        tools.append(McpTool.from_function(fn, name=full, description=(fn.__doc__ or "").strip()))
    return tools


def toolbox(toolsets: Sequence[vf.Toolset[Any, Any]], state: vf.State) -> Toolbox:
    """The toolsets' tools as one `Toolbox` whose calls see `state`; two tools may not share a name."""
    tools = [tool for toolset in toolsets for tool in mcp_tools(toolset)]
    return Toolbox([bound(tool, state) for tool in tools], schemas=[schema(tool) for tool in tools])


def schema(tool: McpTool) -> dict[str, Any]:
    """The OpenAI-style schema verifiers' harnesses hand the model for an MCP tool."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def bound(tool: McpTool, state: vf.State) -> ToolFunc:
    """`tool` as a lorarl tool function whose calls see `state` as the toolset's `state`."""

    @functools.wraps(tool.fn)
    async def call(**arguments: Any) -> Any:
        token = _call_state.set(state)
        try:
            return await tool.fn_metadata.call_fn_with_arg_validation(tool.fn, tool.is_async, arguments, None)
        finally:
            _call_state.reset(token)

    return call


class SharedToolsets:
    """A taskset's toolsets: one instance each for the run, set up once, on first use."""

    def __init__(self, toolsets: list[vf.Toolset[Any, Any]]) -> None:
        self.toolsets = toolsets
        self._ready: asyncio.Task[None] | None = None

    async def ready(self) -> list[vf.Toolset[Any, Any]]:
        if self._ready is None:  # one setup, however many episodes ask at once
            self._ready = asyncio.ensure_future(_setup_all(self.toolsets))
        await asyncio.shield(self._ready)
        return self.toolsets


async def _setup_all(toolsets: list[vf.Toolset[Any, Any]]) -> None:
    await asyncio.gather(*(toolset.setup() for toolset in toolsets))


async def setup_for_task(toolsets: list[vf.Toolset[Any, Any]], task: vf.Task) -> None:
    """Set a rollout's toolsets up for its task, as their server does when it starts."""
    await _setup_all(toolsets)
    await asyncio.gather(*(toolset.setup_task(task.data) for toolset in toolsets))


async def close(toolsets: list[vf.Toolset[Any, Any]]) -> None:
    """Release what a rollout's toolsets entered in setup (their server exits its stack)."""
    for toolset in toolsets:
        await toolset._exit_stack.aclose()
