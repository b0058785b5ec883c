"""A run in a few numbers: reward at the start and the end, evals of the first and last policy,
grad norm, step time and the on-policy logprob mismatch. The learning check, the seed experiments and
summarize_run.py print these; they read metrics.jsonl through the plots' loader, so every reader
agrees on what a run holds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from lorarl.monitor.plots import Run, load_runs


@dataclass(frozen=True)
class RunSummary:
    steps: int
    reward_first: float  # mean of reward/mean over the first `window` steps
    reward_last: float  # ... and over the last `window` steps
    evals: dict[str, tuple[float, float]]  # eval/<env>/avg@k or pass@k -> (first version, last version)
    grad_norm: float | None  # the trainer's mean grad norm over the run
    step_time: float | None  # the trainer's median seconds per step
    # The largest |trainer - vLLM| logprob of a step trained on-policy (policy lag 0); None without one.
    # A step with an empty batch (all groups had zero advantage) has neither lag nor mismatch.
    on_policy_mismatch: float | None

    def eval_change(self, kind: str) -> str:
        """'0.100 → 0.400' for each eval metric whose name starts with `kind` ("avg@", "pass@")."""
        found = [f"{a:.3f} → {b:.3f}" for k, (a, b) in sorted(self.evals.items()) if k.split("/")[-1].startswith(kind)]
        return ", ".join(found) or "—"


def summarize(path: Path, window: int = 10) -> dict[str, RunSummary]:
    """The summary of the run folder (or metrics.jsonl) at `path`, by run label: one entry, or one per
    variant of a sweep ([[variants]], labelled `<folder>/<variant>`)."""
    return {run.label: _summarize(run, path, window) for run in load_runs(path, path.name)}


def _summarize(run: Run, path: Path, window: int) -> RunSummary:
    _, rewards = run.series("orchestrator", "reward/mean")
    if not rewards:
        raise ValueError(f"{path}: no orchestrator step with reward/mean in its metrics")
    evals = {}
    for metric in run.metrics.get("eval", {}):
        if not metric.startswith("eval/"):
            continue  # the eval's own time/eval
        _, values = run.series("eval", metric)
        evals[metric] = (values[0], values[-1])
    _, grad_norms = run.series("trainer", "grad_norm")
    _, step_times = run.series("trainer", "time/step")
    trainer = run.metrics.get("trainer", {})
    lags, mismatches = trainer.get("policy_lag/max", {}), trainer.get("mismatch/logprob_abs_diff", {})
    on_policy = [mismatch for step, mismatch in mismatches.items() if lags.get(step) == 0]
    return RunSummary(
        steps=len(rewards),
        reward_first=statistics.fmean(rewards[:window]),
        reward_last=statistics.fmean(rewards[-window:]),
        evals=evals,
        grad_norm=statistics.fmean(grad_norms) if grad_norms else None,
        step_time=statistics.median(step_times) if step_times else None,
        on_policy_mismatch=max(on_policy, default=None),
    )


def only(summaries: dict[str, RunSummary]) -> RunSummary:
    """The summary of a run with one adapter (not a sweep)."""
    (summary,) = summaries.values()
    return summary
