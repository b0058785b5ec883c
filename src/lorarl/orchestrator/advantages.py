"""Advantages: each rollout's reward against the other rollouts of the same example.

`[orchestrator.advantage] type` picks the estimator (config/algorithms.py): a built-in here, or
"custom" with `fn` ("package.module:function") and `args`. Both are the same kind of object, a function
declared `@lorarl.plugin("advantage")` that maps a group's rewards (and, if it takes them, its episodes)
to one advantage per rollout, its config's keys as keyword arguments; `advantage_estimator` returns the
one the config asks for, with the same signature for all. `GroupAdvantages` is the loop's stage around
it: overlong shaping of the rewards before, masking of truncated episodes after (overlong.py).
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from lorarl.config.algorithms import AdvantageConfig, CustomAdvantage
from lorarl.config.orchestrator import OrchestratorConfig
from lorarl.orchestrator.episodes import PlayedEpisode
from lorarl.orchestrator.groups import Group
from lorarl.orchestrator.overlong import PENALTY_KEY, mask_truncated, overlong_penalty
from lorarl.plugins import fit_args, load_function, plugin

Estimator = Callable[[list[float], Sequence[PlayedEpisode]], list[float]]


class AdvantageFn(Protocol):
    """An advantage estimator, built in or yours (`[orchestrator.advantage] type = "custom"`,
    `fn = "package.module:function"`, declared `@lorarl.plugin("advantage")`): one finite advantage per
    reward of a group (the rollouts of one example), from the rewards (less any overlong penalty) and
    the group's episodes, in the same order, and the keyword arguments of its config (`args`). A
    function of the rewards alone (one positional parameter) is called without the episodes."""

    def __call__(self, rewards: list[float], episodes: list[PlayedEpisode], /, **kwargs: Any) -> Sequence[float]: ...


def _tied(rewards: list[float]) -> bool:
    """All rewards equal: no estimator has anything to tell the rollouts apart with."""
    return max(rewards) == min(rewards)


@plugin("advantage")
def grpo(rewards: list[float], *, eps: float = 1e-6) -> list[float]:
    """GRPO: (r_i - mean) / (std + eps); exactly 0 for a tied group (float rounding of the mean could
    otherwise leave crumbs)."""
    if _tied(rewards):
        return [0.0] * len(rewards)
    std = statistics.pstdev(rewards)
    return [c / (std + eps) for c in dr_grpo(rewards)]


@plugin("advantage")
def dr_grpo(rewards: list[float]) -> list[float]:
    """Dr. GRPO: r_i - mean, unscaled; exactly 0 for a tied group."""
    if _tied(rewards):
        return [0.0] * len(rewards)
    mean = statistics.fmean(rewards)
    return [r - mean for r in rewards]


@plugin("advantage")
def rloo(rewards: list[float]) -> list[float]:
    """RLOO: r_i - the mean of the others' rewards, i.e. n / (n - 1) * (r_i - mean); 0 for a group of one."""
    n = len(rewards)
    if n < 2 or _tied(rewards):
        return [0.0] * n
    total = math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


BUILTIN: dict[str, Callable[..., list[float]]] = {fn.__name__: fn for fn in (grpo, dr_grpo, rloo)}


def advantage_estimator(cfg: AdvantageConfig) -> Estimator:
    """The estimator of `cfg`: a built-in with its keys, or `cfg.fn` imported with its args (an error
    names it if it cannot be). The result checks what a user function returns: one finite number per
    reward."""
    if not isinstance(cfg, CustomAdvantage):
        builtin = BUILTIN[cfg.type]
        kwargs = cfg.model_dump(exclude={"type"})
        return lambda rewards, episodes: builtin(rewards, **kwargs)
    fn = import_estimator(cfg)

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


def import_estimator(cfg: CustomAdvantage) -> Callable[[list[float], list[PlayedEpisode]], Sequence[float]]:
    """The function `cfg.fn` names (declared `@lorarl.plugin("advantage")`, so a Python function with a
    signature) with `cfg.args` checked against it, called with the episodes only if it takes a second
    positional argument. Raises PluginError or ArgsError, one line naming the key."""
    fn = load_function(cfg.fn, "orchestrator.advantage.fn", "advantage")
    params = inspect.signature(fn).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    with_episodes = len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)
    kwargs = fit_args(fn, cfg.args, leading=2 if with_episodes else 1)
    if with_episodes:
        return lambda rewards, episodes: cast(AdvantageFn, fn)(rewards, episodes, **kwargs)
    return lambda rewards, episodes: fn(rewards, **kwargs)


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
