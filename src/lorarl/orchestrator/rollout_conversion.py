"""`to_rollouts`: finished groups become the trainer's rollouts, one per sample of each episode.

Advantages are normalized within each group (the episodes of one example), so every sample of an
episode carries its episode's advantage.
"""

from __future__ import annotations

from lorarl.orchestrator.advantages import group_advantages
from lorarl.orchestrator.groups import Group
from lorarl.rollouts import Rollout


def to_rollouts(groups: list[Group], std_normalize: bool, temperature: float) -> list[Rollout]:
    rollouts = []
    for group in groups:
        advantages = group_advantages([score["reward"] for score in group.scores], std_normalize)
        for played, score, advantage in zip(group.episodes, group.scores, advantages, strict=True):
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
