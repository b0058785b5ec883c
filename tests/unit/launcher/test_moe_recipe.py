"""configs/gpu/moe_math/8gpu.toml, RL with expert LoRA on Qwen3-30B-A3B: its memory plan counts the
expert LoRA (PEFT's 2r gate_up_proj per expert) in the trainer and in vLLM's slots, at the rank vLLM is
started with, and the vLLM command carries the flag that loads PEFT's fused expert layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorarl.config.loader import load_config
from lorarl.config.model import LoraConfig
from lorarl.config.run import RLConfig
from lorarl.inference.server import adapter_slots, served_lora_rank
from lorarl.launcher.memory_plan import (
    NF4_BYTES_PER_PARAMETER,
    adapter_parameters,
    expert_lora,
    model_shape,
    rl_memory_plan,
    serves_expert_lora,
)
from lorarl.launcher.placement import place
from lorarl.launcher.plan import worker_command

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "configs/gpu/moe_math/8gpu.toml"
QWEN3_30B_A3B = "Qwen/Qwen3-30B-A3B"


@pytest.mark.slow
def test_expert_lora_counts_every_expert_at_peft_ranks() -> None:
    """Per layer: 128 experts x (gate_up_proj at 2r: 2r (2048 + 2 x 768), down_proj at r: r (768 + 2048)),
    beside attention's r (d_in + d_out) per projection (32 query and 4 key/value heads of 128)."""
    r, hidden, inter, layers, experts = 8, 2048, 768, 48, 128
    q, kv = 32 * 128, 4 * 128
    attention = r * ((hidden + q) + 2 * (hidden + kv) + (q + hidden))
    per_expert = 2 * r * (hidden + 2 * inter) + r * (inter + hidden)
    assert adapter_parameters(QWEN3_30B_A3B, LoraConfig(rank=r)) == layers * (attention + experts * per_expert)
    assert expert_lora(QWEN3_30B_A3B, LoraConfig(rank=r)) == ["down_proj", "gate_up_proj"]
    assert expert_lora(QWEN3_30B_A3B, LoraConfig(target_modules=["q_proj", "v_proj"])) == []
    assert expert_lora("Qwen/Qwen3-4B", LoraConfig()) == []  # dense


@pytest.mark.slow
def test_the_moe_recipe_fits_with_expert_lora_in_every_process() -> None:
    cfg = load_config(RLConfig, ["@", str(RECIPE)])
    assert cfg.model.name == QWEN3_30B_A3B and cfg.lora.target_modules == LoraConfig().target_modules
    assert served_lora_rank(cfg, serves_expert_lora(cfg)) == 16  # rank 8, gate_up_proj at 16
    command = worker_command(cfg, 8)
    assert "--enable-mixed-moe-lora-format" in command and command[command.index("--max-lora-rank") + 1] == "16"
    plan = rl_memory_plan(cfg, place(cfg, 8))
    assert plan.problem() is None, plan.table()
    trainer = next(p for p in plan.processes if p.process == "trainer")
    parts = {p.what: p.gib for p in trainer.parts}
    # The 0.52B-parameter adapter in float32 with its gradients and AdamW's two moments: 16 bytes each.
    assert abs(parts["adapter+grads+AdamW"] - 16 * adapter_parameters(QWEN3_30B_A3B, cfg.lora) / 2**30) < 0.05
    vllm = {p.what: p.gib for p in plan.processes[0].parts}
    # Each of the adapter_slots in bf16 at vLLM's rank 16 (twice the adapter's), over tensor parallelism 2.
    slots = adapter_parameters(QWEN3_30B_A3B, cfg.lora) * 16 / 8 * adapter_slots(cfg) * 2 / 2 / 2**30
    assert abs(vllm["LoRA slots"] - slots) < 0.05


@pytest.mark.slow
def test_an_nf4_base_of_the_moe_model_counts_its_fused_experts_unquantized() -> None:
    """bitsandbytes quantizes linear layers; transformers 5 fuses each layer's experts into 3D tensors,
    which stay in model.dtype: 48 layers x 128 experts x 3 x 2048 x 768 of the 30.5B parameters."""
    shape = model_shape(QWEN3_30B_A3B)
    assert shape is not None and shape.fused_experts == 48 * 128 * 3 * 2048 * 768
    cfg = load_config(RLConfig, ["@", str(RECIPE), "--model.quantization", "nf4"])
    trainer = next(p for p in rl_memory_plan(cfg, place(cfg, 8)).processes if p.process == "trainer")
    parts = {p.what: p.gib for p in trainer.parts}
    assert abs(parts["experts (not quantized)"] - shape.fused_experts * 2 / 2**30) < 0.05  # bfloat16
    rest = (shape.parameters - shape.fused_experts) * NF4_BYTES_PER_PARAMETER / 2**30
    assert abs(parts["weights (nf4)"] - rest) < 0.05
