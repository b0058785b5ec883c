"""reverse_text with a second reward function that never returns, for the reward-timeout fault test.
Loaded by the orchestrator as `tests.integration.hanging_reward_env:HangingRewardReverseText`."""

from __future__ import annotations

import time

from lorarl.orchestrator.envs.base import Episode, WeightedReward
from lorarl.orchestrator.envs.reverse_text import ReverseText, reversal_similarity


def never_returns(episode: Episode) -> float:
    """Blocks as a deadlocked or hung scorer would: a plain sleep, holding its thread for good."""
    while True:
        time.sleep(3600)


class HangingRewardReverseText(ReverseText):
    name = "hanging_reward_reverse_text"
    rewards = [WeightedReward(reversal_similarity), WeightedReward(never_returns, 0.0)]
