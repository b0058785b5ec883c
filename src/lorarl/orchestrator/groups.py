"""`Group`: the unit the orchestrator samples, batches and trains on.

It has a module of its own because the loop and its components (rollout conversion, batch
metrics, samples) all use it, and the components never import the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.episodes import PlayedEpisode


@dataclass
class Group:
    """`rollouts_per_example` episodes of one example, played with one policy version, and their
    scores (one dict of reward functions per episode, "reward" among them). `advantages`, one per
    episode, are set once it has finished (`Orchestrator.score_group`)."""

    env: Environment
    version: int
    episodes: list[PlayedEpisode]
    scores: list[dict[str, float]]
    advantages: list[float] = field(default_factory=list)

    @property
    def example(self) -> Example:
        return self.episodes[0].episode.example

    @property
    def zero_advantage(self) -> bool:
        """Every advantage is 0: the group carries no policy gradient."""
        return not any(self.advantages)
