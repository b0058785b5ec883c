"""The metrics the orchestrator logs with each batch (component "orchestrator" in metrics.jsonl).

Two kinds: what the batch's groups hold (rewards, lengths, policy lag, per environment), and what
the step that produced it counted (`StepCounters`: time, groups dropped, inference load).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from lorarl.orchestrator.groups import Group
from lorarl.rollouts import policy_lag


def batch_metrics(groups: list[Group], step: int) -> dict[str, float]:
    """Rewards, lengths and policy lag of the batch for trainer step `step`."""
    scores = [score for g in groups for score in g.scores]
    lags = [policy_lag(step, g.version) for g in groups]
    episodes = [e for g in groups for e in g.episodes]
    lengths = [e.model_tokens for e in episodes]
    out = {
        "reward/mean": statistics.fmean(s["reward"] for s in scores),
        "reward/std": statistics.pstdev(s["reward"] for s in scores),
        "reward_errors": sum(s["reward_errors"] for s in scores),
        "completion_len/mean": statistics.fmean(lengths),
        "completion_len/max": max(lengths),
        "turns/mean": statistics.fmean(len(e.episode.turns) for e in episodes),
        "truncated_frac": statistics.fmean(e.truncated for e in episodes),
        # Episodes the chat template's re-rendered history split into several samples (episodes.py).
        "split_frac": statistics.fmean(len(e.samples) > 1 for e in episodes),
        "timed_out_frac": statistics.fmean(e.timed_out for e in episodes),
        "policy_version": min(g.version for g in groups),
        "policy_lag/mean": statistics.fmean(lags),
        "policy_lag/max": max(lags),
    }
    # Per environment: the mean of each of its reward functions (and metrics) over the episodes that
    # have it: an environment from another library may score some episodes on keys others lack.
    for env_name in sorted({g.env.name for g in groups}):
        env_scores = [score for g in groups if g.env.name == env_name for score in g.scores]
        for key in dict.fromkeys(key for score in env_scores for key in score):
            out[f"env/{env_name}/{key}"] = statistics.fmean(score[key] for score in env_scores if key in score)
    return out


@dataclass
class StepCounters:
    """What one step counts from the previous batch to its own; each step starts a fresh one."""

    started: float  # time.perf_counter() when the step started
    busy_at_start: float  # the workers' busy seconds then (WorkerPool.busy_seconds)
    outages_at_start: int  # workers taken out of routing so far then (WorkerPool.outages)
    dropped_groups: int = 0  # groups dropped as too old for any batch still to come
    waited_for_policy: float = 0.0  # seconds with nothing to do but wait for a newer policy

    def metrics(
        self,
        now: float,
        busy: float,
        *,
        workers: int,
        rollouts_per_example: int,
        groups_in_flight: int,
        completion_tokens: int,
        outages: int,
    ) -> dict[str, float]:
        """The step's metrics as it ends at `now`, the workers then busy for `busy` seconds in all."""
        elapsed = now - self.started
        return {
            "dropped/groups": self.dropped_groups,
            "dropped/rollouts": self.dropped_groups * rollouts_per_example,
            "time/wait_for_policy": self.waited_for_policy,
            "time/step": elapsed,
            "inference/busy_frac": (busy - self.busy_at_start) / max(1e-9, elapsed * workers),
            "inference/groups_in_flight": groups_in_flight,
            "inference/outages": outages - self.outages_at_start,
            "tokens_per_s": completion_tokens / max(1e-9, elapsed),
        }
