"""Expert LoRA on a tiny random Qwen3-MoE: what the trainer computes is what vLLM will serve.

The adapter the trainer writes (PEFT's fused 3D layout) is read by vLLM's own loader
(`LoRAModel.from_local_checkpoint`, the worker's path for a load request) and turned into the per-expert
w1/w2/w3 tensors of vLLM's 2D MoE LoRA wrapper by vLLM's own conversion
(`LoRAModelManager._convert_3d_to_2d_moe_lora`, what `--enable-mixed-moe-lora-format` plus
`is_3d_lora_weight` select). A hand-written MoE forward that adds each chosen expert's LoRA from those
tensors must then give the trainer's MoE block output: the two sides agree on every expert. No vLLM
server: the CPU build cannot serve expert LoRA (docs/moe.md). The SFT and RL trainers train expert LoRA
on that model, and the orchestrator's load request flags the fused layout.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import peft
import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional as F
from vllm.config.lora import LoRAConfig
from vllm.lora.lora_model import LoRAModel
from vllm.lora.model_manager import LoRAModelManager
from vllm.lora.peft_helper import PEFTHelper
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM as VllmQwen3Moe

from lorarl.config.loader import load_config
from lorarl.config.model import LoraConfig
from lorarl.config.run import RLConfig
from lorarl.config.sft import SFTConfig
from lorarl.inference.client import fused_expert_lora
from lorarl.launcher.plan import worker_command
from lorarl.rollouts import RolloutBatch
from lorarl.run_folder import RunFolder
from lorarl.tiny_model import build_moe_model, save_tiny_model
from lorarl.trainer import rl, sft
from lorarl.trainer.model import check_vllm_can_serve, save_adapter
from tests.unit.inference.test_client import Recording
from tests.unit.trainer.test_loss_with_model import rollouts_for, trained_adapter

HIDDEN, LAYERS, EXPERTS, RANK = 64, 2, 4, 4
INTER = HIDDEN // 2  # build_moe_model's expert width


def moe_with_adapter(lora: LoraConfig) -> peft.PeftModel:
    """The tiny MoE with expert LoRA whose B is random (a fresh adapter's B = 0 would hide any mix-up)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT says it converted transformers 4's expert names
        return trained_adapter(build_moe_model(259, 2, 0, EXPERTS, HIDDEN, LAYERS), lora)


def vllm_loads(folder: Path, cfg: RLConfig) -> LoRAModel:
    """The adapter as a vLLM worker loads it for a Qwen3-MoE served as `rl` starts it for `cfg`
    (--enable-mixed-moe-lora-format, and a load request with is_3d_lora_weight = true), its expert LoRA
    split into per-expert w1/w2/w3."""
    command = worker_command(cfg, 1)
    assert "--enable-mixed-moe-lora-format" in command
    assert fused_expert_lora(str(folder))  # so the orchestrator's load request says is_3d_lora_weight
    helper = PEFTHelper.from_local_dir(str(folder), max_position_embeddings=2048)
    # The worker's check: every rank (PEFT's rank_pattern too) fits the --max-lora-rank rl starts it with.
    max_rank = int(command[command.index("--max-lora-rank") + 1])
    helper.validate_legal(LoRAConfig(max_lora_rank=max_rank, max_loras=1))
    # The modules the worker expects of a Qwen3-MoE (WorkerLoRAManager._load_adapter): the packed q/k/v,
    # o_proj, and the experts module.
    expected = {"q_proj", "k_proj", "v_proj", "o_proj", "experts"}
    mapper = VllmQwen3Moe.hf_to_vllm_mapper.get_rename_mapper()
    model = LoRAModel.from_local_checkpoint(
        str(folder), expected, helper, lora_model_id=1, device="cpu", dtype=torch.float32, weights_mapper=mapper
    )
    model.is_3d_lora_weight = True
    for weights in model.loras.values():
        weights.optimize()  # scaling into B, as activate_adapter does before converting
    # The manager's conversion needs of it only the model's architecture (no vLLM model is built here).
    manager = object.__new__(LoRAModelManager)
    manager.model = SimpleNamespace(config=SimpleNamespace(architectures=["Qwen3MoeForCausalLM"]))  # type: ignore[assignment]
    manager.is_pooling_model = False
    experts = SimpleNamespace(local_num_experts=EXPERTS, global_num_experts=EXPERTS, ep_rank=0)
    for layer in range(LAYERS):
        manager._convert_3d_to_2d_moe_lora(model, experts, f"model.layers.{layer}.mlp.experts")  # type: ignore[arg-type]
    return model


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(
        tmp_path_factory.mktemp("moe") / "model", hidden_size=HIDDEN, num_layers=LAYERS, num_experts=EXPERTS
    )


def reference_moe(block: Any, x: torch.Tensor, lora: Any) -> torch.Tensor:
    """Qwen3-MoE's sparse block by hand: softmax router, top-2 renormalised, each chosen expert's
    SiLU-gated MLP with its LoRA added per expert: W + B_e A_e for w1 (gate), w3 (up), w2 (down)."""
    experts = block.experts.get_base_layer() if hasattr(block.experts, "get_base_layer") else block.experts
    gate_up, down = experts.gate_up_proj, experts.down_proj  # [E, 2I, H], [E, H, I]
    (a1, a2, a3), (b1, b2, b3) = lora.lora_a, lora.lora_b  # [E, r, in], [E, out, r]
    probs = F.softmax(x @ block.gate.weight.T, dim=-1)
    top, chosen = probs.topk(2, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(2):
            e = int(chosen[t, k])
            w1 = gate_up[e, :INTER] + b1[e] @ a1[e]
            w3 = gate_up[e, INTER:] + b3[e] @ a3[e]
            w2 = down[e] + b2[e] @ a2[e]
            out[t] += top[t, k] * (w2 @ (F.silu(w1 @ x[t]) * (w3 @ x[t])))
    return out


@pytest.mark.parametrize("use_rslora", [False, True])
def test_vllm_loads_the_expert_adapter_onto_every_expert_as_the_trainer_computes_it(
    moe_folder: Path, tmp_path: Path, use_rslora: bool
) -> None:
    lora = LoraConfig(rank=RANK, alpha=8, use_rslora=use_rslora)
    model = moe_with_adapter(lora)
    check_vllm_can_serve(model)  # rl trains it
    save_adapter(model, tmp_path)
    loaded = vllm_loads(tmp_path, RLConfig(model={"name": str(moe_folder), "lora": lora.model_dump()}))

    # Every layer's experts, and the attention modules, each once; nothing left in the 3D layout.
    attention = {f"model.layers.{i}.self_attn.{m}" for i in range(LAYERS) for m in ("q_proj", "k_proj", "v_proj")}
    attention |= {f"model.layers.{i}.self_attn.o_proj" for i in range(LAYERS)}
    assert set(loaded.loras) == attention | {f"model.layers.{i}.mlp.experts" for i in range(LAYERS)}
    for i in range(LAYERS):
        experts = loaded.loras[f"model.layers.{i}.mlp.experts"]
        # w1 and w3 (gate, up) share PEFT's gate_up A at rank 2r; w2 (down) has rank r.
        assert [tuple(a.shape) for a in experts.lora_a] == [
            (EXPERTS, 2 * RANK, HIDDEN),
            (EXPERTS, RANK, INTER),
            (EXPERTS, 2 * RANK, HIDDEN),
        ]
        assert [tuple(b.shape) for b in experts.lora_b] == [
            (EXPERTS, INTER, 2 * RANK),
            (EXPERTS, HIDDEN, RANK),
            (EXPERTS, INTER, 2 * RANK),
        ]

    # The trainer's MoE block with the adapter, against the hand-written sum with vLLM's tensors.
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(2))
    for i in range(LAYERS):
        block = model.base_model.model.model.layers[i].mlp
        with torch.no_grad():
            trainer = block(x[None])[0]
            want = reference_moe(block, x, loaded.loras[f"model.layers.{i}.mlp.experts"])
            with model.disable_adapter():
                base = block(x[None])[0]
        assert torch.allclose(trainer, want, atol=1e-5), (trainer - want).abs().max()
        assert not torch.allclose(trainer, base, atol=1e-3)  # the adapter does change the experts' output


def test_vllm_refuses_the_fused_layout_without_room_for_gate_up_rank() -> None:
    """PEFT gives the fused gate_up_proj rank 2r: a --max-lora-rank of r alone would refuse the adapter,
    which is why rl starts vLLM with room for 2r when it trains expert LoRA (inference/server.py)."""
    helper = PEFTHelper.from_dict(
        {"r": 8, "lora_alpha": 16, "target_modules": [], "rank_pattern": {"gate_up_proj": 16}}
    )
    with pytest.raises(ValueError, match="LoRA rank 16 is greater than max_lora_rank 8"):
        helper.validate_legal(LoRAConfig(max_lora_rank=8, max_loras=1))


def test_expert_lora_on_one_projection_alone_is_refused_before_vllm_misreads_it() -> None:
    """PEFT wraps down_proj alone (or gate_up_proj alone) as `experts`, which vLLM takes for down_proj."""
    for targets in (["q_proj", "down_proj"], ["q_proj", "gate_proj", "up_proj"]):
        with pytest.raises(ValueError, match=r"vLLM serves expert LoRA on gate_up_proj and down_proj together"):
            check_vllm_can_serve(moe_with_adapter(LoraConfig(rank=RANK, target_modules=targets)))
    check_vllm_can_serve(moe_with_adapter(LoraConfig(rank=RANK, target_modules=["q_proj", "k_proj"])))


def expert_b_norms(folder: Path) -> list[float]:
    """The norm of each expert LoRA B tensor of an adapter folder (a fresh adapter's are 0)."""
    tensors = load_file(folder / "adapter_model.safetensors")
    return [float(t.norm()) for name, t in sorted(tensors.items()) if ".experts." in name and "lora_B" in name]


def test_rl_trainer_steps_train_expert_lora_and_broadcast_what_vllm_loads(moe_folder: Path, tmp_path: Path) -> None:
    """The RL trainer (rollouts written by hand, no vLLM) on the MoE with the default targets: its
    steps move every expert LoRA, and each broadcast loads into vLLM's expert layout."""
    lora = {"rank": RANK, "alpha": 8}
    cfg = RLConfig(
        model={"name": str(moe_folder), "lora": lora},
        max_steps=2,
        output_dir=tmp_path,
        monitor={"console": False},
        trainer={"optim": {"lr": 1e-2}},
    )
    run = RunFolder(cfg.run_dir).create()
    for step in (1, 2):
        RolloutBatch(step, rollouts_for(step)).write(run.rollouts(step))
    rl.train(cfg)
    assert expert_b_norms(run.broadcast(0)) == [0.0] * 2 * LAYERS
    assert all(n > 0 for n in expert_b_norms(run.broadcast(2)))
    loaded = vllm_loads(run.broadcast(2), cfg)
    assert {f"model.layers.{i}.mlp.experts" for i in range(LAYERS)} <= set(loaded.loras)


def test_sft_trains_expert_lora(moe_folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": w, "completion": w[::-1]}) + "\n" for w in ("apple", "stone", "kite"))
    )
    args = [
        "--model.name",
        str(moe_folder),
        "--data.path",
        str(data),
        "--output_dir",
        str(tmp_path),
        "--seq_len",
        "32",
        "--batch_size",
        "3",
        "--max_steps",
        "2",
        "--model.lora.rank",
        str(RANK),
        "--no-monitor.console",
    ]
    cfg = load_config(SFTConfig, args)
    sft.train(cfg)
    assert all(n > 0 for n in expert_b_norms(cfg.run_dir / "final"))


def test_the_load_request_says_is_3d_lora_weight_for_fused_expert_lora_only(tmp_path: Path) -> None:
    """The orchestrator's load request (the real client, its HTTP request recorded) for the folders the
    trainer writes: with expert LoRA, and with LoRA on attention alone, which vLLM loads as always."""
    for name, targets in (("experts", LoraConfig().target_modules), ("attention", ["q_proj", "v_proj"])):
        save_adapter(moe_with_adapter(LoraConfig(rank=RANK, target_modules=targets)), tmp_path / name)
    client = Recording("http://h:1")
    asyncio.run(client.load_adapter("a", str(tmp_path / "experts")))
    asyncio.run(client.load_adapter("b", str(tmp_path / "attention")))
    assert client.sent[0] == {"lora_name": "a", "lora_path": str(tmp_path / "experts"), "is_3d_lora_weight": True}
    assert client.sent[1] == {"lora_name": "b", "lora_path": str(tmp_path / "attention")}
