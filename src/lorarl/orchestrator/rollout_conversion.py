"""`to_rollouts`: finished groups become the trainer's rollouts, one per sample of each episode.

Each group carries one advantage per episode (advantages.py, set when it finished), so every sample
of an episode carries its episode's advantage.
"""

from __future__ import annotations

from lorarl.orchestrator.groups import Group
from lorarl.rollouts import Rollout


def to_rollouts(groups: list[Group], temperature: float) -> list[Rollout]:
    rollouts = []
    for group in groups:
        for played, score, advantage in zip(group.episodes, group.scores, group.advantages, strict=True):
            rollouts += [
                Rollout(
                    prompt_ids=sample.prompt_ids,
                    completion_ids=sample.completion_ids,
                    completion_logprobs=sample.completion_logprobs,
                    completion_mask=sample.completion_mask,
                    advantage=advantage,
                    reward=score["reward"],
                    policy_version=group.version,
                    temperature=temperature,
                    env=group.env.name,
                    metrics=score,
                )
                for sample in played.samples
            ]
    return rollouts
