"""The served-adapter check's metrics (component "served", one row per version) on the console line
and in lorarl-plot."""

from __future__ import annotations

from pathlib import Path

from lorarl.monitor.console import StepPrinter
from lorarl.monitor.plots import PANELS, load_runs
from tests.unit.monitor.test_console import write_rows


def test_the_console_line_shows_the_newest_versions_probe_gap(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    printer = StepPrinter(path, max_steps=5)
    write_rows(path, {"component": "trainer", "step": 1, "loss": 0.5})
    assert "| served - |" in printer.poll()[0]  # no version checked yet
    write_rows(
        path,
        {"component": "served", "step": 1, "served/probe_gap": 3e-7, "served/vs_base": 0.02},
        {"component": "served", "step": 0, "served/probe_gap": 0.4},  # an older version, logged late
        {"component": "trainer", "step": 2, "loss": 0.5},
    )
    assert "| served 3e-07 |" in printer.poll()[0]


def test_lorarl_plot_draws_both_gaps_per_version(tmp_path: Path) -> None:
    write_rows(
        tmp_path / "metrics.jsonl",
        *({"component": "served", "step": v, "served/probe_gap": 1e-7, "served/vs_base": 0.01 * v} for v in range(3)),
    )
    [run] = load_runs(tmp_path, "run")
    [panel] = [p for p in PANELS if p.name == "served_check"]
    assert sorted(line.name for line in panel.lines(run)) == ["probe_gap", "vs_base"]
    assert run.series("served", "served/vs_base") == ([0, 1, 2], [0.0, 0.01, 0.02])
