"""A run's summary reads what the run logged: rewards at the start and end, the first and last
evals, the trainer's grad norm, step time and on-policy mismatch; a run without rewards is named in
the error."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorarl.monitor.summary import only, summarize
from tests.unit.monitor.test_plots import rl_rows, write_metrics


def test_summary_of_a_learning_run(tmp_path: Path) -> None:
    run = write_metrics(tmp_path / "run", rl_rows(steps=6, learn=0.1, evals=True))
    s = only(summarize(run, window=2))
    assert s.steps == 6
    assert s.reward_first == pytest.approx((0.3 + 0.4) / 2)  # steps 1, 2: 0.2 + 0.1 * step
    assert s.reward_last == pytest.approx((0.7 + 0.8) / 2)
    assert s.evals["eval/reverse_text/avg@4"] == pytest.approx((0.2, 0.6))  # versions 0 and 4
    assert set(s.evals) == {"eval/reverse_text/avg@4", "eval/reverse_text/pass@4"}  # not time/eval
    assert s.eval_change("pass@") == "0.400 → 0.800"
    assert s.grad_norm == pytest.approx(sum(1 / k + 0.1 for k in range(1, 7)) / 6)
    assert s.step_time == pytest.approx(1.05)
    assert s.on_policy_mismatch is None  # every step trained one version behind


def test_the_on_policy_mismatch_is_the_largest_of_the_steps_with_lag_0(tmp_path: Path) -> None:
    rows = rl_rows(steps=4, learn=0.0, evals=False)
    for row in rows:
        if row["component"] == "trainer" and row["step"] in (1, 2):
            row["policy_lag/max"] = 0
    assert only(summarize(write_metrics(tmp_path / "run", rows))).on_policy_mismatch == pytest.approx(2e-6)


def test_summary_without_evals_or_trainer_rows(tmp_path: Path) -> None:
    rows = [r for r in rl_rows(steps=3, learn=0.0, evals=False) if r["component"] == "orchestrator"]
    s = only(summarize(write_metrics(tmp_path / "run", rows)))
    assert (s.steps, s.evals, s.grad_norm, s.step_time, s.on_policy_mismatch) == (3, {}, None, None, None)
    assert s.eval_change("avg@") == "—"


def test_a_run_without_rewards_is_named(tmp_path: Path) -> None:
    run = write_metrics(tmp_path / "sft-run", [{"step": 1, "component": "sft", "loss": 1.0}])
    with pytest.raises(ValueError, match="sft-run: no orchestrator step"):
        summarize(run)


def test_a_sweep_is_summarized_per_variant(tmp_path: Path) -> None:
    rows = [r | {"variant": v} for v, learn in (("r1", 0.0), ("r64", 0.1)) for r in rl_rows(4, learn, evals=False)]
    summaries = summarize(write_metrics(tmp_path / "sweep", rows), window=1)
    assert list(summaries) == ["sweep/r1", "sweep/r64"]
    assert summaries["sweep/r1"].reward_last == pytest.approx(0.2)
    assert summaries["sweep/r64"].reward_last == pytest.approx(0.6)
