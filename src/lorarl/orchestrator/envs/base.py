"""The environment API: what a task gives the orchestrator.

An environment is a stream of examples (plain dicts), the chat messages that open an episode for
an example, and weighted reward functions of (example, completion text). Writing a new one is a
one-file job: subclass `Environment`, fill in `examples` and `prompt`, list `rewards`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Message = dict[str, str]
Example = dict[str, Any]
RewardFunc = Callable[[Example, str], float]


@dataclass(frozen=True)
class WeightedReward:
    func: RewardFunc
    weight: float = 1.0

    @property
    def name(self) -> str:
        return self.func.__name__


class Environment:
    """Single-turn environment: one prompt, one completion, rewards from the completion text."""

    name: str = "environment"
    rewards: list[WeightedReward] = []

    def examples(self, rng: random.Random) -> Iterator[Example]:
        """An endless stream of training examples drawn with `rng`."""
        raise NotImplementedError

    def prompt(self, example: Example) -> list[Message]:
        """The chat messages the model answers."""
        raise NotImplementedError

    def solution(self, example: Example) -> str:
        """A correct answer, used to build supervised warm-up data. Optional."""
        raise NotImplementedError(f"{self.name} has no reference solutions")

    def score(self, example: Example, completion: str) -> dict[str, float]:
        """Each reward function's value, and their weighted sum under "reward"."""
        scores = {r.name: float(r.func(example, completion)) for r in self.rewards}
        scores["reward"] = sum(r.weight * scores[r.name] for r in self.rewards)
        return scores
