"""The environment API: what a task gives the orchestrator.

An environment is a stream of examples (plain dicts), the chat messages that open an episode,
for multi-turn tasks an `env_response` that answers each model turn (or ends the episode), and
weighted reward functions of the finished `Episode`. Writing one is a one-file job: subclass
`Environment`, fill in `examples` and `prompt`, list `rewards` (see examples/custom_environment/).
Tasks where the model calls Python functions subclass `ToolEnvironment` (envs/tool_env.py) instead.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lorarl.orchestrator.reward_calls import RewardTimeout, abandoned_still_running, call_bounded

Message = dict[str, str]
"""One chat message: `{"role": "user", "content": "..."}` (roles system, user, assistant, tool)."""
Example = dict[str, Any]
"""One task instance as `Environment.examples` draws it, e.g. `{"word": "banana", "letter": "a"}`."""

log = logging.getLogger("lorarl.orchestrator")


@dataclass
class Episode:
    """One rollout as the environment sees it: the whole conversation, and scratch `state` the
    environment may fill in `env_response` (e.g. the expected answer of each turn)."""

    example: Example
    messages: list[Message]
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> list[str]:
        """What the model wrote, turn by turn."""
        return [m["content"] for m in self.messages if m["role"] == "assistant"]

    @property
    def completion(self) -> str:
        """The model's last turn (its whole answer, for single-turn environments)."""
        turns = self.turns
        return turns[-1] if turns else ""


RewardFunc = Callable[[Episode], float | Awaitable[float]]
"""A reward function: the finished episode's score, a float (or, `async def`, awaited to one)."""


@dataclass(frozen=True)
class WeightedReward:
    """A reward function and its weight in the episode's reward, the weighted sum over
    `Environment.rewards`; weight 0 logs a value without training on it."""

    func: RewardFunc
    weight: float = 1.0

    @property
    def name(self) -> str:
        """The function's name, the key its value is logged under."""
        return getattr(self.func, "__name__", type(self.func).__name__)


class Environment:
    """A task: subclass it, fill in `examples` and `prompt`, list `rewards`, and for a multi-turn task
    set `max_turns` and answer each model turn in `env_response` (see the module docstring)."""

    name: str = "environment"
    # Model turns per episode; `env_response` is asked for the next messages after each but the last.
    max_turns: int = 1
    # Seconds an episode may run from its start (env responses and model turns); once past, it ends
    # after its last finished model turn and is counted in `timed_out_frac`. None: no limit.
    # [[orchestrator.env]] episode_timeout sets it.
    episode_timeout: float | None = None
    rewards: list[WeightedReward] = []
    # Seconds one reward function may take for one episode; past it the episode scores 0 for it, counted
    # in `reward_errors`, and the call is abandoned (reward_calls.py). orchestrator.reward_timeout sets it.
    reward_timeout: float = 600.0

    def examples(self, rng: random.Random) -> Iterator[Example]:
        """An endless stream of training examples drawn with `rng`. One example dict is shared by
        all episodes of its group: keep per-episode data in `episode.state`, never in the example."""
        raise NotImplementedError

    def eval_examples(self, rng: random.Random) -> Iterator[Example]:
        """Held-out examples for evals. By default the training generator drawn with its own seed
        (`orchestrator.eval.seed`); an environment with a fixed test split overrides this."""
        return self.examples(rng)

    def prompt(self, example: Example) -> list[Message]:
        """The chat messages that open an episode."""
        raise NotImplementedError

    def env_response(self, episode: Episode) -> list[Message] | None | Awaitable[list[Message] | None]:
        """After a model turn: the next user or tool messages, or None to end the episode. May be
        `async def` (waiting on a tool, a sandbox, a service); the orchestrator awaits it."""
        return None

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tools the chat template shows the model (OpenAI-style schemas); None: no tools."""
        return None

    def solution(self, example: Example) -> str:
        """A correct answer, to build supervised warm-up data (single-turn environments)."""
        raise NotImplementedError(f"{self.name} has no reference solutions")

    def solutions(self, example: Example) -> list[str]:
        """The model's turns of a correct episode, to build supervised warm-up data; multi-turn
        environments override it (scripts/make_sft_data.py plays them through `env_response`)."""
        return [self.solution(example)]

    async def score(self, episode: Episode) -> dict[str, float]:
        """Each reward function's value, their weighted sum ("reward") and "reward_errors": a
        reward function that raises, returns NaN or an infinity, or runs past `reward_timeout`
        scores 0 and is counted; it never stops the run, nor reaches the advantages."""
        scores: dict[str, float] = {}
        errors = 0
        for r in self.rewards:
            try:
                value = await call_bounded(r.func, episode, self.reward_timeout, f"reward {r.name} of {self.name}")
                scores[r.name] = float(value)
                if not math.isfinite(scores[r.name]):
                    raise ValueError(f"returned {scores[r.name]}")
            except Exception as e:
                self._reward_failed(r, e)
                scores[r.name] = 0.0
                errors += 1
        scores["reward"] = sum(r.weight * scores[r.name] for r in self.rewards)
        scores["reward_errors"] = errors
        return scores

    def _reward_failed(self, reward: WeightedReward, error: Exception) -> None:
        """Log a reward call that scores 0: one line for a timeout, the traceback for an error."""
        if isinstance(error, RewardTimeout):
            log.warning(
                "reward function %s of %s: %s (orchestrator.reward_timeout); scoring 0, the call abandoned "
                "(%d abandoned call(s) still running)",
                reward.name,
                self.name,
                error,
                abandoned_still_running(),
            )
        else:
            log.error("reward function %s of %s raised; scoring 0", reward.name, self.name, exc_info=error)
