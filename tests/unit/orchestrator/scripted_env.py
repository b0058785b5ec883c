"""An environment whose examples say how they score, for the orchestrator's filter tests with the
stand-in pool of test_orchestrator_loop.py (which answers half of each group with the alphabet and
half with nothing). Loaded as `tests.unit.orchestrator.scripted_env:Scripted`.

Examples are "<kind>-<n>": "easy" scores 1 for every episode, "hard" 0, "mixed" 1 for a non-empty
answer and 0 for an empty one, so only mixed groups have non-zero advantages.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import lorarl
from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message, WeightedReward


def scripted_reward(episode: Episode) -> float:
    kind = episode.example["name"].split("-")[0]
    return {"easy": 1.0, "hard": 0.0}.get(kind, float(bool(episode.completion.strip())))


class Scripted(Environment):
    name = "scripted"
    rewards = [WeightedReward(scripted_reward)]

    def __init__(self, kinds: tuple[str, ...] = ("easy", "hard", "mixed"), per_kind: int = 3) -> None:
        self.kinds, self.per_kind = kinds, per_kind

    def examples(self, rng: random.Random) -> Iterator[Example]:
        while True:
            yield {"name": f"{rng.choice(self.kinds)}-{rng.randrange(self.per_kind)}"}

    def prompt(self, example: Example) -> list[Message]:
        return [{"role": "user", "content": example["name"]}]


@lorarl.plugin("advantage")
def by_answer_length(rewards: list[float], episodes: list) -> list[float]:
    """An `advantage.fn` that takes the episodes too: the answer's length in characters, less 13."""
    return [len(played.episode.completion) - 13.0 for played in episodes]
