"""Bad input to `rl`, the MoE part of the table: LoRA on the experts of an MoE model where rl would
start vLLM on the CPU. vLLM serves expert LoRA only with its Triton MoE LoRA kernels, which its CPU
build lacks, so `rl` and `rl --dry-run` (every check a start makes) refuse it in one line naming
[model.lora] target_modules, before anything starts, and write nothing (`bad_inputs.assert_refused`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lorarl.cli import rl
from lorarl.tiny_model import save_tiny_model
from tests.unit.cli.bad_inputs import Workspace, assert_refused

NEEDS_GPU = "serving expert LoRA needs a GPU build of vLLM"


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("moe") / "tiny-moe", hidden_size=64, num_layers=2, num_experts=4)


def moe_args(w: Workspace, model: Path, *more: str) -> list[str]:
    return ["--model.name", str(model), "--output_dir", str(w.out), "--run_name", "new-moe", *more]


@pytest.mark.parametrize(
    "targets",
    [
        [],  # the default: attention and MLP projections, the experts' among them
        ["--model.lora.target_modules", "all-linear"],
        ["--model.lora.target_modules", '["gate_proj", "up_proj", "down_proj"]'],
    ],
    ids=["default", "all-linear", "experts"],
)
def test_rl_refuses_expert_lora_served_on_the_cpu(
    ws: Workspace, moe_model: Path, capsys: pytest.CaptureFixture[str], targets: list[str]
) -> None:
    names = f"[model.lora] target_modules puts LoRA on the experts of the MoE model {moe_model} "
    argv = moe_args(ws, moe_model, *targets, "--dry-run")
    assert_refused(ws, capsys, "rl", argv, f"{names}(down_proj, gate_up_proj), and {NEEDS_GPU}")


def test_rl_refuses_it_before_anything_starts(
    ws: Workspace, moe_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A start, not a dry run: the same line, and no run folder, process or vLLM server."""
    assert_refused(ws, capsys, "rl", moe_args(ws, moe_model), NEEDS_GPU)


def test_rl_dry_runs_attention_lora_on_the_same_model(
    ws: Workspace, moe_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal is the experts', not the model's: LoRA on attention alone passes every check."""
    attention = '["q_proj", "k_proj", "v_proj", "o_proj"]'
    rl.main(moe_args(ws, moe_model, "--model.lora.target_modules", attention, "--dry-run"))
    assert NEEDS_GPU not in capsys.readouterr().err
