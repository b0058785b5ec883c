"""`lorarl-plot` draws synthetic runs: the panels their metrics fill, valid PNGs, none for metrics
no run has, and one line (exit 2) for a run it cannot read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread

from lorarl.cli.plot import main
from lorarl.monitor.plots import load_runs, run_labels
from lorarl.written_files import recorded

RL_PANELS = ["reward", "reward_by_function", "eval", "policy_lag", "mismatch", "entropy", "grad_norm", "loss",
             "step_time", "throughput"]  # fmt: skip
SFT_PANELS = ["sft_loss", "sft_grad_norm", "sft_lr", "sft_throughput"]


def write_metrics(folder: Path, rows: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def rl_rows(steps: int, learn: float, evals: bool) -> list[dict[str, Any]]:
    """The rows an rl run with the reverse_text environment writes, with rewards rising by `learn`."""
    rows: list[dict[str, Any]] = []
    for step in range(1, steps + 1):
        reward = min(1.0, 0.2 + learn * step)
        rows.append({"step": step, "component": "orchestrator", "time": 1e9 + step, "reward/mean": reward,
                     "reward/std": 0.1, "reward_errors": 0, "env/reverse_text/lcs_ratio": reward,
                     "env/reverse_text/reward": reward, "env/reverse_text/reward_errors": 0,
                     "policy_lag/mean": 0.5, "policy_lag/max": 1, "tokens_per_s": 900.0 + step})  # fmt: skip
        rows.append({"step": step, "component": "trainer", "time": 1e9 + step, "loss": learn / step,
                     "grad_norm": 1.0 / step + learn, "lr": 1e-3, "mismatch/logprob_abs_diff": 1e-6 * step,
                     "mismatch/kl": 1e-7 * step, "entropy": 2.0 - learn * step, "policy_lag/mean": 0.5,
                     "policy_lag/max": 1, "tokens_per_s": 400.0, "time/wait_for_batch": 0.2,
                     "time/forward_backward": 0.6 + learn, "time/optimizer": 0.05, "time/broadcast": 0.1,
                     "time/checkpoint": 0.0, "time/step": 0.95 + learn})  # fmt: skip
    if evals:
        rows += [{"step": version, "component": "eval", "eval/reverse_text/avg@4": 0.2 + learn * version,
                  "eval/reverse_text/pass@4": 0.4 + learn * version, "time/eval": 3.0}
                 for version in (0, 2, 4)]  # fmt: skip
    return rows


def sft_rows(steps: int) -> list[dict[str, Any]]:
    return [{"step": step, "component": "sft", "loss": 3.0 / step, "grad_norm": 2.0, "lr": 1e-3 * step / steps,
             "tokens_per_s": 700.0, "padding_frac": 0.0} | ({"eval/loss": 3.2 / step} if step % 2 == 0 else {})
            for step in range(1, steps + 1)]  # fmt: skip


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    assert path.stat().st_size > 10_000, path  # a drawn figure, not an empty canvas
    height, width, _ = imread(path).shape
    assert height > 300 and width > 300, path


@pytest.mark.slow
def test_rl_and_sft_runs_overlaid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fast = write_metrics(tmp_path / "fast", rl_rows(5, 0.15, evals=True))
    slow = write_metrics(tmp_path / "slow", rl_rows(5, 0.05, evals=False))
    sft = write_metrics(tmp_path / "warmup", sft_rows(5))
    out = tmp_path / "plots"
    main([str(fast), str(slow), str(sft), "--out", str(out)])
    printed = capsys.readouterr().out.split()
    expected = [out / "overview.png", *(out / f"{name}.png" for name in RL_PANELS + SFT_PANELS)]
    assert printed == [str(path) for path in expected]
    assert sorted(out.glob("*.png")) == sorted(expected)
    assert {out / name for name in recorded(out)} == set(expected)  # the record of what lorarl-plot wrote
    for path in expected:
        assert_png(path)
    # A grid of 14 panels, 3 to a row: five rows, taller than wide.
    height, width, _ = imread(out / "overview.png").shape
    assert height > width


@pytest.mark.slow
def test_panels_without_data_are_not_drawn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_metrics(tmp_path / "no-evals", rl_rows(5, 0.1, evals=False))
    main([str(run)])  # default --out: the run's plots/
    written = sorted(path.name for path in (run / "plots").glob("*.png"))
    assert written == sorted(["overview.png", *(f"{name}.png" for name in RL_PANELS if name != "eval")])
    assert capsys.readouterr().out.splitlines()[0] == str(run / "plots" / "overview.png")


@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_sft_run_gets_only_sft_panels(tmp_path: Path) -> None:
    run = write_metrics(tmp_path / "sft", sft_rows(5))
    main([str(run)])
    assert sorted(path.name for path in (run / "plots").glob("*.png")) == sorted(
        ["overview.png", *(f"{name}.png" for name in SFT_PANELS)]
    )


def test_metrics_file_given_directly_and_nulls_skipped(tmp_path: Path) -> None:
    rows = sft_rows(5)
    rows[0]["loss"] = None  # a NaN, as MetricsLogger writes it
    run = write_metrics(tmp_path / "direct", rows)
    main([str(run / "metrics.jsonl")])
    assert_png(run / "plots" / "sft_loss.png")


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "missing: no metrics.jsonl"),
        ('{"step": 1, "component": "trainer", "loss": 1.0}\n{"step": 2, "comp\n', "metrics.jsonl:2: not a JSON object"),
        ("[1, 2]\n", "metrics.jsonl:1: not a metrics row"),
        ('{"step": 1, "component": "trainer", "reward_errors": 0}\n', "nothing to plot: no known metrics in"),
    ],
)
def test_unreadable_run_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, error: str
) -> None:
    run = tmp_path / "missing"
    if content is not None:
        run.mkdir()
        (run / "metrics.jsonl").write_text(content)
    with pytest.raises(SystemExit) as exc:
        main([str(run)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and error in err and str(run) in err, err
    assert not (run / "plots").exists()


def test_runs_sharing_a_folder_name_are_labelled_by_path(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    assert run_labels([a, tmp_path / "other"]) == ["run", "other"]
    assert run_labels([a, b]) == [str(a), str(b)]


@pytest.mark.slow
def test_runs_as_a_command_without_a_display(tmp_path: Path) -> None:
    # A process of its own, as the console script runs it, with no display and no backend chosen.
    run = write_metrics(tmp_path / "cmd", sft_rows(3))
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    cmd = [sys.executable, "-m", "lorarl.cli.plot", str(run)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == str(run / "plots" / "overview.png")
    assert_png(run / "plots" / "overview.png")


@pytest.mark.slow
def test_a_sweeps_variants_are_drawn_as_runs_of_their_own(tmp_path: Path) -> None:
    rows = [row | {"variant": name} for name, learn in (("r1", 0.01), ("r64", 0.1)) for row in rl_rows(4, learn, True)]
    sweep = write_metrics(tmp_path / "sweep", rows)
    runs = load_runs(sweep, "sweep")
    assert [run.label for run in runs] == ["sweep/r1", "sweep/r64"]
    # Each variant's own values, not the other's written over them at the same step.
    assert runs[0].series("trainer", "loss")[1] == [0.01 / s for s in range(1, 5)]
    assert runs[1].series("eval", "eval/reverse_text/avg@4")[1] == pytest.approx([0.2, 0.4, 0.6])
    main([str(sweep)])
    assert_png(sweep / "plots" / "reward.png")
