"""benchmarks/runner.py's pure logic, what every benchmark's figures rest on: a run's metrics rows come
from read_metrics (the one reader of metrics.jsonl), the steady state leaves out the first steps (every
variant's row of them), an `rl` run's summary, and Markdown table rows."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lorarl.monitor.plots import MetricsError
from tests.conftest import REPO


@pytest.fixture(scope="module")
def runner() -> Iterator[ModuleType]:
    """benchmarks/runner.py as the benchmarks import it (benchmarks/ is on their path: files run as
    scripts); loaded from its file, so that benchmarks/ stays off the tests' path."""
    spec = importlib.util.spec_from_file_location("runner", REPO / "benchmarks" / "runner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def write_metrics(run: Path, rows: list[dict[str, Any]]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run


def test_metrics_rows_are_read_metrics_rows_of_a_component_in_step_order(runner: ModuleType, tmp_path: Path) -> None:
    rows = [
        {"step": 2, "component": "trainer", "variant": "a", "time/step": 1.0},
        {"step": 1, "component": "orchestrator", "reward/mean": 0.5},
        {"step": 2, "component": "trainer", "variant": "b", "time/step": 2.0},
        {"step": 1, "component": "trainer", "variant": "a", "time/step": 3.0},
    ]
    run = write_metrics(tmp_path / "run", rows)
    trainer = runner.metrics_rows(run, "trainer")
    assert [(r["step"], r["variant"]) for r in trainer] == [(1, "a"), (2, "a"), (2, "b")]  # a step's rows as written
    assert [r["component"] for r in runner.metrics_rows(run)] == ["orchestrator", "trainer", "trainer", "trainer"]


def test_metrics_rows_refuse_what_read_metrics_refuses(runner: ModuleType, tmp_path: Path) -> None:
    run = write_metrics(tmp_path / "run", [{"step": 1, "component": "trainer"}])
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"component": "trainer"}\n')  # no step
    with pytest.raises(MetricsError, match=r"metrics.jsonl:2"):
        runner.metrics_rows(run)


def test_after_warmup_leaves_out_the_first_items_unless_nothing_would_be_left(runner: ModuleType) -> None:
    assert runner.after_warmup([5.0, 1.0, 2.0]) == [1.0, 2.0]
    assert runner.after_warmup([5.0, 4.0, 1.0, 2.0], warmup=2) == [1.0, 2.0]
    assert runner.after_warmup([5.0]) == [5.0]
    assert runner.after_warmup([5.0, 4.0], warmup=2) == [5.0, 4.0]


def test_steady_rows_leave_out_every_row_of_the_first_steps(runner: ModuleType) -> None:
    rows = [{"step": s, "variant": v} for s in (1, 2, 3) for v in ("a", "b")]
    assert [(r["step"], r["variant"]) for r in runner.steady_rows(rows)] == [(2, "a"), (2, "b"), (3, "a"), (3, "b")]
    assert [r["step"] for r in runner.steady_rows(rows, warmup=2)] == [3, 3]
    assert runner.steady_rows(rows[:2]) == rows[:2]  # one step only: it is all there is


def test_rl_summary_is_the_steady_state_of_the_run(runner: ModuleType, tmp_path: Path) -> None:
    trainer = [
        {"step": s, "component": "trainer", "time": 10.0 * s, "time/step": 10.0, "time/wait_for_batch": w,
         "policy_lag/mean": lag}
        for s, w, lag in ((1, 9.0, 0.0), (2, 1.0, 1.0), (3, 3.0, 0.0))
    ]  # fmt: skip
    orchestrator = [
        {"step": s, "component": "orchestrator", "inference/busy_frac": busy, "reward/mean": reward,
         "dropped/groups": dropped}
        for s, busy, reward, dropped in ((1, 0.1, 0.0, 5), (2, 0.5, 0.2, 1), (3, 0.7, 0.4, 0))
    ]  # fmt: skip
    summary = runner.rl_summary(write_metrics(tmp_path / "run", trainer + orchestrator))
    # Steps 2 and 3: from step 2's start (its time less its time/step) to step 3's end, 20 s.
    assert summary == pytest.approx(
        {"steps_per_min": 6.0, "trainer_idle_frac": 0.2, "inference_busy_frac": 0.6, "policy_lag_mean": 0.5,
         "reward_last": 0.3, "dropped_groups": 1}
    )  # fmt: skip


def test_markdown_rows(runner: ModuleType) -> None:
    assert runner.markdown_head(["run", "s / step"]) == "| run | s / step |\n|---|---|"
    assert runner.markdown_row(["sweep", 2, ""]) == "| sweep | 2 |  |"
