"""reverse_text whose first example never finishes scoring: a straggler group, for the
continuous-batching test (`max_off_policy_steps`). Loaded by the orchestrator as
`tests.integration.straggler_env:StragglerReverseText`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

from lorarl.orchestrator.envs.base import Episode, Example, WeightedReward
from lorarl.orchestrator.envs.reverse_text import ReverseText, reversal_similarity


async def is_straggler(episode: Episode) -> float:
    """Weight 0: leaves the reward alone, but marks the straggler's rollouts in their metrics."""
    if episode.example.get("straggler"):
        await asyncio.sleep(3600)
        return 1.0
    return 0.0


class StragglerReverseText(ReverseText):
    name = "straggler_reverse_text"
    rewards = [WeightedReward(reversal_similarity), WeightedReward(is_straggler, 0.0)]

    def examples(self, rng: random.Random) -> Iterator[Example]:
        stream = super().examples(rng)
        yield {**next(stream), "straggler": True}
        yield from stream
