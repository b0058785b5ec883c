"""The base model and its LoRA adapter (PEFT), shared by the RL and SFT trainers."""

from __future__ import annotations

import peft
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from lorarl.config.models import LoraConfig, ModelConfig


def load_model(cfg: ModelConfig) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(
        cfg.name, dtype=getattr(torch, cfg.dtype), attn_implementation=cfg.attn_implementation
    )
    return model


def peft_lora_config(cfg: LoraConfig) -> peft.LoraConfig:
    return peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        use_rslora=cfg.use_rslora,
        target_modules=cfg.target_modules,
        task_type="CAUSAL_LM",
    )


def apply_lora(model: PreTrainedModel, cfg: LoraConfig) -> peft.PeftModel:
    """Wrap `model` with a trainable LoRA adapter: fresh (B = 0, so it starts as the base model)
    or loaded from `cfg.init_adapter`. Only adapter weights require grad."""
    if cfg.init_adapter is not None:
        cfg.check_init_adapter()
        return peft.PeftModel.from_pretrained(model, str(cfg.init_adapter), is_trainable=True)
    return peft.get_peft_model(model, peft_lora_config(cfg))


def parameter_summary(model: torch.nn.Module) -> dict[str, float]:
    trainable = [p for p in model.parameters() if p.requires_grad]
    return {
        "params/trainable": sum(p.numel() for p in trainable),
        "params/total": sum(p.numel() for p in model.parameters()),
        "params/trainable_bytes": sum(p.numel() * p.element_size() for p in trainable),
    }
