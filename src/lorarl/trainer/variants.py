"""Several LoRA adapters on one base model, trained in one process: a sweep ([[variants]]) in one run.

The base weights are loaded once; each variant's adapter is added to the same PEFT model under the
name `variant_<name>` (`adapter_name`: PEFT warns of, and may mis-load, adapter names that are part
of its "lora_" prefix, such as "a"); ranks, alphas, rsLoRA and targets may differ. At every step each variant in turn
waits for its own batch and trains on it (rl.train_step) while it is the active adapter: PEFT's
`set_adapter` makes it the only adapter in the forward pass and the only one that requires grad,
so its backward pass reaches its weights alone, and its optimizer, built while it alone was
trainable, holds its parameters alone. One variant's gradient or optimizer state never touches
another's: given the same batches, a variant trains the adapter it would train in a run of its own
(tests/unit/trainer/test_variants.py), up to float noise.

Each variant is a `Trainer` (trainer.py) of its own over the shared model, with its effective
config and its view of the run folder (its rollouts, broadcasts and checkpoints).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import peft
import torch

from lorarl.config.run import RLConfig
from lorarl.cpu.host_memory import set_host_malloc
from lorarl.run_folder import RunFolder
from lorarl.trainer.checkpoint import find_checkpoint, load_weights
from lorarl.trainer.distributed import init_data_parallel
from lorarl.trainer.model import (
    apply_lora,
    check_lora_for_rl,
    check_vllm_can_serve,
    enable_gradient_checkpointing,
    load_model,
)
from lorarl.trainer.policy_gap import PolicyHistory
from lorarl.trainer.rl import train_step, write_starting_adapter
from lorarl.trainer.served_probe import attach_probe
from lorarl.trainer.trainer import Trainer, log_parameters
from lorarl.variants import Variant, variants_of

log = logging.getLogger("lorarl.trainer")


@dataclass
class VariantTrainer:
    variant: Variant
    trainer: Trainer[peft.PeftModel]

    def activate(self) -> Trainer[peft.PeftModel]:
        """Make this variant's adapter the one that runs and trains; returns its trainer."""
        self.trainer.model.set_adapter(adapter_name(self.variant))
        return self.trainer


def adapter_name(variant: Variant) -> str:
    """The PEFT adapter name of `variant` in the shared model (module docstring)."""
    return f"variant_{variant.name}"


def train_variants(cfg: RLConfig) -> None:
    """The RL trainer loop (rl.train) for every variant of `cfg`, step by step, variant by variant."""
    variants = set_up_variants(cfg)
    attach_probe(variants[0].trainer.model, cfg)  # one model: every variant's versions carry the probe
    metrics = {v.variant.name: v.trainer.metrics_logger("trainer", v.variant.cfg) for v in variants}
    histories = {v.variant.name: PolicyHistory.for_config(v.variant.cfg) for v in variants}
    for v in variants:
        write_starting_adapter(v.activate(), histories[v.variant.name])
    start = variants[0].trainer.start  # the same for all: variants_of pins one resume step
    for step in range(start + 1, cfg.max_steps + 1):
        for v in variants:
            train_step(v.activate(), v.variant.cfg, step, metrics[v.variant.name], histories[v.variant.name])
    for logger in metrics.values():
        logger.close()
    variants[0].trainer.dp.close()


def set_up_variants(cfg: RLConfig) -> list[VariantTrainer]:
    """Trainer.set_up for a sweep: the base model once, an adapter per variant, each variant's
    checkpoint (when resuming) into its adapter, then an optimizer and a schedule per variant."""
    dp = init_data_parallel(cfg.trainer.parallel)  # dp = 1: the config refuses more with variants
    set_host_malloc(dp.device().type == "cpu", cfg.keep_freed_memory)
    RunFolder(cfg.run_dir).create()
    variants = variants_of(cfg)
    torch.manual_seed(cfg.seed)
    model: peft.PeftModel | None = None
    base = load_model(cfg.model)
    seeded = torch.get_rng_state()
    for v in variants:
        check_lora_for_rl(v.cfg.lora)
        # Each fresh adapter draws its initial weights from where a run of its own would: the same
        # random state, right after the base model is loaded.
        torch.set_rng_state(seeded)
        model = apply_lora(base if model is None else model, v.cfg.lora, adapter_name(v))
    assert model is not None  # the config has variants
    check_vllm_can_serve(model)
    if cfg.trainer.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    checkpoints = {}
    for v in variants:
        model.set_adapter(adapter_name(v))
        log_parameters(model, v.cfg)
        if v.cfg.resume is not None:
            checkpoints[v.name] = find_checkpoint(v.run, v.cfg.resume.step)
            load_weights(checkpoints[v.name], model)
    dp.place(model)
    pad_id = model.config.pad_token_id or 0
    trainers = []
    for v in variants:
        model.set_adapter(adapter_name(v))  # its optimizer gets its parameters only
        trainer = Trainer.on_placed_model(v.cfg, v.run, dp, model, checkpoints.get(v.name), pad_id)
        trainers.append(VariantTrainer(v, trainer))
    log.info("training %d variants on one base model: %s", len(variants), ", ".join(v.name for v in variants))
    return trainers
