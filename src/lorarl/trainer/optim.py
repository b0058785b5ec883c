"""Optimizer and learning-rate schedule, shared by the RL and SFT trainers."""

from __future__ import annotations

import math

import torch

from lorarl.config.trainer import OptimConfig, SchedulerConfig
from lorarl.trainer.model import trainable_parameters


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    params = trainable_parameters(model)
    if not params:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, max_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps)
        if cfg.type == "linear":
            return max(0.0, 1.0 - progress)
        if cfg.type == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
