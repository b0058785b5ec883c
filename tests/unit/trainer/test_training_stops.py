"""Training that has gone wrong stops, and writes nothing from it (trainer.py's `TrainingStopped`):
an update that makes weights NaN or infinite, and a gradient stuck at 0 while there is a loss to
learn (saturated weights). Real runs of the tiny model at learning rates far too high: float16
weights overflow at lr 1e6 on the first update; float32 LoRA weights saturate, their gradient 0
from step 2 on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.config.sft import SFTConfig
from lorarl.exit_codes import TRAINING_STOPPED
from lorarl.rollouts import RolloutBatch
from lorarl.run_folder import RunFolder
from lorarl.trainer import rl, sft
from lorarl.trainer.update_watch import TrainingStopped
from tests.unit.trainer.test_loss_with_model import rollouts_for


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    words = "apple stone river cloud green paper tiger lemon honey kite".split()
    path = tmp_path_factory.mktemp("sft-data") / "data.jsonl"
    path.write_text("".join(json.dumps({"prompt": w, "completion": w[::-1]}) + "\n" for w in words))
    return path


def sft_args(model: Path, data: Path, out: Path, *more: str) -> list[str]:
    paths = ["--model.name", str(model), "--data.path", str(data), "--output_dir", str(out)]
    return [*paths, "--seq_len", "64", "--batch_size", "4", "--ckpt.interval", "1", "--no-monitor.console", *more]


@pytest.mark.parametrize(
    "parallel", [[], ["--parallel.dp", "2", "--parallel.fsdp"]], ids=["one process", "two fsdp ranks"]
)
@pytest.mark.slow
def test_sft_whose_weights_overflow_stops_in_one_line_and_writes_no_result(
    tiny_model: Path, sft_data: Path, tmp_path: Path, parallel: list[str]
) -> None:
    """Through the installed console script: exit 3 (TRAINING_STOPPED), one line naming the step and
    the key, and no checkpoint or final/ (every step would have written a checkpoint). With fsdp the
    weights checked are each rank's shards; under torchrun still one line, and torchrun's exit code."""
    overflow = ["--max_steps", "3", "--model.dtype", "float16", "--optim.lr", "1e6", *parallel]
    args = sft_args(tiny_model, sft_data, tmp_path, *overflow)
    result = subprocess.run([str(Path(sys.executable).parent / "sft"), *args], capture_output=True, text=True)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == TRAINING_STOPPED, result.stderr
    stop = "step 1: the update made weights NaN or infinite (lr 1e+06); lower optim.lr and start again"
    assert len(errors) == 1 and errors[0].startswith(f"error: {stop}"), result.stderr
    assert "Traceback" not in result.stderr
    run = tmp_path / "default"
    assert (run / "run.json").is_file() and not (run / "final").exists() and not (run / "checkpoints").exists()


def test_sft_whose_gradient_collapses_stops_before_the_result(tiny_model: Path, sft_data: Path, tmp_path: Path) -> None:
    """LoRA at lr 1e6: step 1 learns, then the saturated model's gradient is exactly 0 while its loss
    is not. Steps 2-4 (optim.max_skipped_steps = 3) and the run stops: no final/."""
    args = sft_args(tiny_model, sft_data, tmp_path, "--max_steps", "8", "--optim.lr", "1e6", "--log_interval", "1")
    cfg = load_config(SFTConfig, [*args, "--model.lora.rank", "8"])
    with pytest.raises(TrainingStopped, match=r"^step 4: the gradient norm was exactly 0 for 3 steps in a row"):
        sft.train(cfg)
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["grad_norm"] > 0 for r in rows] == [True, False, False]  # step 4 stopped before its row
    assert all(r["loss"] > 1 for r in rows)  # something to learn all along
    assert RunFolder(cfg.run_dir).checkpoint_steps() == [1, 2, 3]  # finite weights, to start again from step 1's
    assert not (cfg.run_dir / "final").exists()


def overflowing_rl_run(model_path: Path, out: Path) -> tuple[RLConfig, RunFolder]:
    """An RL run whose step 1 overflows float16 weights, prepared as `rl` prepares it, with its
    rollouts written by hand."""
    model = {"name": str(model_path), "full_finetune": True, "dtype": "float16"}
    trainer = {"optim": {"lr": 1e6}, "ckpt": {"interval": 1}}
    cfg = RLConfig(model=model, max_steps=2, output_dir=out, monitor={"console": False}, trainer=trainer)
    run = RunFolder(cfg.run_dir)
    run.prepare("rl", cfg.model_dump(mode="json"), resume=False, overwrite=False)
    run.create()
    for step in (1, 2):
        RolloutBatch(step, rollouts_for(step)).write(run.rollouts(step))
    return cfg, run


def test_rl_whose_weights_overflow_writes_no_adapter_of_them(tiny_model: Path, tmp_path: Path) -> None:
    """The RL trainer: the run stops before broadcasts/step_1, so the orchestrator never serves them."""
    cfg, run = overflowing_rl_run(tiny_model, tmp_path)
    with pytest.raises(TrainingStopped, match=r"^step 1: the update made weights NaN or infinite .* trainer.optim.lr"):
        rl.train(cfg)
    assert run.broadcast(0).is_dir() and not run.broadcast(1).exists() and not run.checkpoint_steps()


@pytest.mark.slow
def test_the_rl_trainer_ends_a_stop_with_the_exit_code_rl_does_not_restart(tiny_model: Path, tmp_path: Path) -> None:
    """`lorarl-trainer`, the installed script `rl` starts, exits TRAINING_STOPPED with its one line:
    `rl` neither restarts it (auto_resume, tests/unit/launcher/test_launch_failures.py) nor shows more."""
    cfg, _ = overflowing_rl_run(tiny_model, tmp_path)
    config = tmp_path / "rl.json"
    config.write_text(json.dumps(cfg.model_dump(mode="json")))
    trainer = str(Path(sys.executable).parent / "lorarl-trainer")
    result = subprocess.run([trainer, "@", str(config)], capture_output=True, text=True)
    assert result.returncode == TRAINING_STOPPED, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: step 1: the update made weights NaN or infinite")
    assert "Traceback" not in result.stderr
