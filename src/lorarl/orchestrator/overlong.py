"""Episodes that run into `sampling.max_tokens` (`[orchestrator.overlong]`).

Two remedies from DAPO, each optional:

* `overlong_penalty`: soft reward shaping. With a buffer of B tokens, an episode whose longest model
  turn has L tokens loses penalty * (L - (max_tokens - B)) / B of reward once L passes
  max_tokens - B, and the full penalty when truncated. The advantage estimator sees the shaped reward.
* `mask_truncated`: a truncated episode's advantage becomes 0: it trains neither way.
"""

from __future__ import annotations

from lorarl.config.orchestrator import OverlongConfig
from lorarl.orchestrator.episodes import PlayedEpisode
from lorarl.orchestrator.groups import Group

PENALTY_KEY = "overlong_penalty"  # the score key the penalty is logged under (env/<env>/overlong_penalty)


def overlong_penalty(played: PlayedEpisode, cfg: OverlongConfig, max_tokens: int) -> float:
    """The reward `played` loses for its length (>= 0); 0 without a buffer."""
    if cfg.buffer == 0:
        return 0.0
    if played.truncated:
        return cfg.penalty
    into_buffer = played.longest_turn - (max_tokens - cfg.buffer)
    return cfg.penalty * min(1.0, max(0.0, into_buffer / cfg.buffer))


def mask_truncated(advantages: list[float], episodes: list[PlayedEpisode]) -> list[float]:
    """`advantages` with those of truncated episodes set to 0."""
    return [0.0 if played.truncated else a for a, played in zip(advantages, episodes, strict=True)]


def overlong_metrics(groups: list[Group], cfg: OverlongConfig) -> dict[str, float]:
    """`overlong/masked`: the episodes masked for truncation among `groups` (with mask_truncated)."""
    if not cfg.mask_truncated:
        return {}
    return {"overlong/masked": sum(played.truncated for g in groups for played in g.episodes)}
