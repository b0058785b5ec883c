"""Group-normalized advantages: each rollout's reward against the others for the same example."""

from __future__ import annotations

import statistics


def group_advantages(rewards: list[float], std_normalize: bool = True, eps: float = 1e-6) -> list[float]:
    mean = statistics.fmean(rewards)
    centered = [r - mean for r in rewards]
    if not std_normalize or len(rewards) < 2:
        return centered
    std = statistics.pstdev(rewards)
    return [c / (std + eps) for c in centered]
