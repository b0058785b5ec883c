"""`ExampleSampler`: which environment and example each group plays, reproducibly resumable."""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice
from typing import Any

from lorarl.orchestrator.envs.base import Environment, Example


class ExampleSampler:
    """Draws an environment by weight, then its next example. The state is the main RNG and how
    many examples each environment has given: example streams are deterministic per seed, so a
    resumed run replays them to the same position instead of pickling generators."""

    def __init__(self, envs: list[Environment], weights: list[float], seed: int | str) -> None:
        self.envs, self.weights = envs, weights
        self.rng = random.Random(seed)
        self._seeds = [self.rng.random() for _ in envs]
        self._streams: list[Iterator[Example]] = [
            env.examples(random.Random(s)) for env, s in zip(envs, self._seeds, strict=True)
        ]
        self.drawn = [0] * len(envs)

    def draw(self) -> tuple[Environment, Example]:
        i = self.rng.choices(range(len(self.envs)), self.weights)[0]
        self.drawn[i] += 1
        return self.envs[i], next(self._streams[i])

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "drawn": list(self.drawn)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        for i, n in enumerate(state["drawn"]):
            self._streams[i] = self.envs[i].examples(random.Random(self._seeds[i]))
            for _ in islice(self._streams[i], n):
                pass
        self.drawn = list(state["drawn"])
