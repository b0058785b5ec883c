"""A verifiers `Env`'s multi-turn protocol, with lorarl's episode runner as its agent.

verifiers 0.4 writes a multi-turn task as an `Env` whose `run(task, agents)` plays the user's side:
it opens `agents.<seat>.interaction(task)`, takes each of the model's replies from `turn(...)` and
answers it (a game engine steps, a scripted user speaks) until it returns. verifiers plays each
segment as a harness program behind its interception server; here the seat's `turn` waits for
lorarl's runner instead, which samples the model's turns itself (episodes.py), so the tokens stay
those vLLM sampled. `run` pushes user turns and the runner pulls them (`env_response`): an
`Exchange` is the pair of queues between the two, with `run` (then `finalize`) in its own task.
The seat's trace is the episode's live `vf.Trace`; leaving the interaction scores the task on it,
and whatever `run` records after that (a game's outcome) is scored too, as in verifiers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.agent import Segment
from verifiers.v1.configs.agent import agent_config_fields
from verifiers.v1.dialects import parse_message
from verifiers.v1.types import content_text
from verifiers.v1.utils.generic import concrete_type

from lorarl.orchestrator.envs.base import Message

log = logging.getLogger("lorarl.orchestrator")


class Exchange:
    """One episode of `env`: its `run` on a seat whose turns are the runner's model turns."""

    def __init__(
        self, env: vf.Env[Any], task: vf.Task, trace: vf.Trace, seat: str, score: Callable[[], Awaitable[None]]
    ) -> None:
        self.task, self.trace, self.score = task, trace, score
        self._segments: asyncio.Queue[Segment] = asyncio.Queue()  # the model's, to `run`
        self._replies: asyncio.Queue[list[Message] | None] = asyncio.Queue()  # `run`'s; None: it ended
        self._started = self._over = False
        self.error: Exception | None = None
        trace.agent.name = seat  # as verifiers stamps a seat's traces, for `finalize`
        agents = vf.Agents(env.config, lambda name, config: _Seat(self))
        self._run = asyncio.ensure_future(self._play(env, agents))

    async def reply(self, segment: Segment) -> list[Message] | None:
        """Hand `run` the model's finished segment: its next user messages, or None once it ended."""
        if self._run.done():
            return None
        await self._segments.put(segment)
        return await self._replies.get()

    async def finish(self) -> None:
        """End the exchange where the runner stopped (max_turns, seq_len, a @stop, the episode's
        timeout): a `turn` still waiting gets a terminated segment, and `run` finishes."""
        if not self._run.done():
            await self._segments.put(Segment(messages=[], terminated=True))
        await self._run

    async def _play(self, env: vf.Env[Any], agents: vf.Agents) -> None:
        try:
            await env.setup(agents)
            await env.run(self.task, agents)
            episode = vf.Episode(env=vf.EnvInfo(id=env.config.env_id), task=self.trace.task, traces=[self.trace])
            await env.finalize(self.task, episode)
        except Exception as e:  # the episode's failure: logged and counted, never the run's
            log.warning("verifiers env %s failed in an episode: %s: %s", type(env).__name__, type(e).__name__, e)
            self.error = e
        finally:
            await self._replies.put(None)

    # The seat's interaction, as `run` sees it (verifiers' `Interaction`).

    async def turn(self, message: str | vf.Messages | list[dict[str, Any]] | None = None) -> Segment:
        """Send a user turn (none for the prompted task's opening reply); the model's segment."""
        if self._over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        if (message is None) == self._started:
            raise ValueError(
                "the task's prompt opens the exchange: take its first reply with a bare turn(), "
                "then answer each with turn(message)"
            )
        self._started = True
        if message is not None:
            await self._replies.put(user_messages(message))
        segment = await self._segments.get()
        self._over = segment.terminated
        return segment

    def check_task(self, task: vf.Task) -> None:
        if task.data != self.task.data:
            raise ValueError(
                "lorarl plays a seat on the taskset's own task (its prompt opened the episode), "
                "not on a task the env made"
            )


class _Seat:
    """The env's one agent: `interaction` is the exchange; `run` is an interaction of one turn."""

    trainable = True  # `Env.setup` may set it; lorarl trains on the seat's tokens either way

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange

    @asynccontextmanager
    async def interaction(self, task: vf.Task, **_: Any) -> AsyncIterator[Exchange]:
        self._exchange.check_task(task)
        try:
            yield self._exchange
        finally:
            await self._exchange.score()  # leaving verifiers' interaction finishes the rollout

    async def run(self, task: vf.Task, **_: Any) -> vf.Trace:
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return interaction.trace


def user_messages(message: str | vf.Messages | list[dict[str, Any]]) -> list[Message]:
    """A user turn as `run` may write it (text, typed or wire messages), as lorarl messages."""
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    typed = [parse_message(m) if isinstance(m, dict) else m for m in message]
    return [{"role": m.role, "content": content_text(m.content)} for m in typed]


def seats(env_type: type[vf.Env[Any]]) -> list[str]:
    """The agent seats the env's config declares."""
    return list(agent_config_fields(env_config(env_type)))


def env_config(env_type: type[vf.Env[Any]]) -> vf.EnvConfig:
    return (concrete_type(env_type, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig)()


def make_env(env_type: type[vf.Env[Any]], taskset: vf.Taskset[Any, Any]) -> vf.Env[Any]:
    """The env with its default config over `taskset`. Not through `Env.__init__`: that builds
    the serving side (harness programs, interception, tool servers) which lorarl replaces; what
    `run`, `setup` and `finalize` read of the env is its `config` and `taskset`."""
    env = object.__new__(env_type)
    env.config = env_config(env_type).model_copy(update={"taskset": taskset.config})
    env.taskset = taskset
    return env
