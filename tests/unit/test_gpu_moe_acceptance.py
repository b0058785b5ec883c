"""scripts/gpu_moe_acceptance.sh up to its first GPU need: its --dry-run builds the small Qwen3-MoE and
passes `rl --dry-run` with the very flags of its run, on one pretended GPU (no CPU refusal there), and
the vLLM command it would start serves PEFT's fused expert LoRA (--enable-mixed-moe-lora-format, room
for gate_up_proj's rank 2r)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_gpu_acceptance import REPO, run_script


@pytest.mark.slow
def test_the_dry_run_plans_expert_lora_on_the_small_moe(tmp_path: Path) -> None:
    result = run_script(tmp_path, "--dry-run", script=REPO / "scripts" / "gpu_moe_acceptance.sh")
    assert result.returncode == 0, result.stderr[-3000:]
    model = tmp_path / "models" / "moe"
    assert f"memory plan: {model}, 63.2M parameters, vocab 259" in result.stdout
    config = json.loads((model / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["num_local_experts"] == 8 and config["head_dim"] == 128
    run = tmp_path / "qwen3-moe" / "configs"
    trainer = json.loads((run / "trainer.json").read_text())
    assert trainer["model"]["lora"]["rank"] == 8 and "down_proj" in trainer["model"]["lora"]["target_modules"]
    assert json.loads((run / "orchestrator.json").read_text())["orchestrator"]["max_async_level"] == 0
    (vllm,) = [line for line in (run / "commands.txt").read_text().splitlines() if "vllm.entrypoints" in line]
    assert "--enable-mixed-moe-lora-format" in vllm and "--max-lora-rank 16 " in vllm and "--dtype bfloat16" in vllm
