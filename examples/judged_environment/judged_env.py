"""An environment graded by a judge model against a rubric: describe an animal in one sentence.

There is no exact answer to check, so `lorarl.Judge` asks a model to grade
each reply against the rubric; by default that model is the run's own vLLM fleet serving the base
model without an adapter, so the judge needs no server of its own. A cheap exact check (one
sentence, the animal named) is weighted in beside it. A judge that gives no grade counts in
`reward_errors` and scores 0, the run goes on.

From the repository root: `.venv/bin/rl @ examples/judged_environment/rl.toml`. On the CPU's tiny
model this is a wiring smoke test (the judge is a model that cannot grade); examples/custom_environment
is the example that learns.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Literal

from lorarl import Environment, Episode, Example, Judge, Message, WeightedReward

ANIMALS = "otter heron badger octopus camel beaver owl lynx".split()
RUBRIC = "The reply describes the animal named in the question in one accurate, vivid English sentence."


def names_the_animal(episode: Episode) -> float:
    text = episode.completion.strip()
    return float(episode.example["animal"] in text.lower() and text.count(".") <= 1)


class DescribeAnimal(Environment):
    name = "describe_animal"

    def __init__(self, reply_format: Literal["free", "score_only"] = "free", judge_max_tokens: int = 512) -> None:
        judge = Judge(RUBRIC, reply_format=reply_format, max_tokens=judge_max_tokens)  # sees the whole conversation
        self.rewards = [WeightedReward(judge, 0.8), WeightedReward(names_the_animal, 0.2)]

    def examples(self, rng: random.Random) -> Iterator[Example]:
        while True:
            yield {"animal": rng.choice(ANIMALS)}

    def prompt(self, example: Example) -> list[Message]:
        return [{"role": "user", "content": f"Describe the {example['animal']} in one sentence."}]
