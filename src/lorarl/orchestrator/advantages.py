"""Advantages: each rollout's reward against the other rollouts of the same example.

`[orchestrator.advantage]` picks the estimator: `estimator` names a built-in, `fn`
("package.module:function") one of your own. Every estimator maps a group's rewards (and, if it
wants them, its episodes) to one advantage per rollout; `advantage_estimator` returns the one the
config asks for, with the same signature for all. `GroupAdvantages` is the loop's stage around it:
overlong shaping of the rewards before, masking of truncated episodes after (overlong.py).
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from lorarl.config.models import AdvantageConfig, OrchestratorConfig
from lorarl.orchestrator.episodes import PlayedEpisode
from lorarl.orchestrator.groups import Group
from lorarl.orchestrator.overlong import PENALTY_KEY, mask_truncated, overlong_penalty
from lorarl.plugins import load_function

Estimator = Callable[[list[float], Sequence[PlayedEpisode]], list[float]]


class AdvantageFn(Protocol):
    """`[orchestrator.advantage] fn = "package.module:function"`, declared `@lorarl.plugin("advantage")`:
    one finite advantage per reward of a group (the rollouts of one example), from the rewards (less
    any overlong penalty) and the group's episodes, in the same order. A function of the rewards
    alone (one parameter) is called without the episodes."""

    def __call__(self, rewards: list[float], episodes: list[PlayedEpisode], /) -> Sequence[float]: ...


def _tied(rewards: list[float]) -> bool:
    """All rewards equal: no estimator has anything to tell the rollouts apart with."""
    return max(rewards) == min(rewards)


def group_advantages(rewards: list[float], std_normalize: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO (r_i - mean) / (std + eps) or, without std_normalize, Dr. GRPO's r_i - mean. Exactly 0
    for a tied group (float rounding of the mean could otherwise leave crumbs)."""
    if _tied(rewards):
        return [0.0] * len(rewards)
    mean = statistics.fmean(rewards)
    centered = [r - mean for r in rewards]
    if not std_normalize:
        return centered
    std = statistics.pstdev(rewards)
    return [c / (std + eps) for c in centered]


def leave_one_out_advantages(rewards: list[float]) -> list[float]:
    """RLOO: r_i - the mean of the others' rewards, i.e. n / (n - 1) * (r_i - mean); 0 for a group of one."""
    n = len(rewards)
    if n < 2 or _tied(rewards):
        return [0.0] * n
    total = math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


BUILTIN: dict[str, Callable[[list[float]], list[float]]] = {
    "grpo": lambda rewards: group_advantages(rewards, std_normalize=True),
    "dr_grpo": lambda rewards: group_advantages(rewards, std_normalize=False),
    "rloo": leave_one_out_advantages,
}


def advantage_estimator(cfg: AdvantageConfig) -> Estimator:
    """The estimator of `cfg`: a built-in, or `cfg.fn` imported (an error names it if it cannot be).
    The result checks what a user function returns: one finite number per reward."""
    if cfg.fn is None:
        builtin = BUILTIN[cfg.estimator]
        return lambda rewards, episodes: builtin(rewards)
    fn = _import_fn(cfg.fn)

    def user_estimator(rewards: list[float], episodes: Sequence[PlayedEpisode]) -> list[float]:
        out = fn(list(rewards), list(episodes))
        try:
            advantages = [float(a) for a in out]
        except TypeError:
            raise TypeError(f"advantage.fn {cfg.fn} returned {type(out).__name__}, not a list of numbers") from None
        if len(advantages) != len(rewards) or not all(math.isfinite(a) for a in advantages):
            raise ValueError(
                f"advantage.fn {cfg.fn} returned {advantages} for the {len(rewards)} rewards {rewards}: "
                "give one finite advantage per reward"
            )
        return advantages

    return user_estimator


def _import_fn(spec: str) -> AdvantageFn:
    """The function `package.module:function` names (declared `@lorarl.plugin("advantage")`, so a Python
    function with a signature), called with the episodes only if it takes a second argument."""
    fn = load_function(spec, "orchestrator.advantage.fn", "advantage")
    params = inspect.signature(fn).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params):
        return cast(AdvantageFn, fn)
    return lambda rewards, episodes: fn(rewards)


class GroupAdvantages:
    """Sets a finished group's advantages: the environment's rewards less any overlong penalty (also
    added to each score as "overlong_penalty"), through the estimator, then truncated episodes masked."""

    def __init__(self, cfg: OrchestratorConfig) -> None:
        self.estimate = advantage_estimator(cfg.advantage)
        self.overlong, self.max_tokens = cfg.overlong, cfg.sampling.max_tokens

    def __call__(self, group: Group) -> Group:
        rewards = [score["reward"] for score in group.scores]
        if self.overlong.buffer:
            for i, (played, score) in enumerate(zip(group.episodes, group.scores, strict=True)):
                score[PENALTY_KEY] = overlong_penalty(played, self.overlong, self.max_tokens)
                rewards[i] -= score[PENALTY_KEY]
        advantages = self.estimate(rewards, group.episodes)
        if self.overlong.mask_truncated:
            advantages = mask_truncated(advantages, group.episodes)
        group.advantages = advantages
        return group
