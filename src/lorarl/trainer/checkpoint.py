"""Trainer checkpoints: everything needed to continue a run exactly where it stopped.

    checkpoints/step_N/trainer/   (RunFolder.trainer_checkpoint)
        adapter/          a PEFT adapter folder (LoRA; usable as model.lora.init_adapter), or
        model.safetensors every weight (full fine-tuning)
        optimizer.pt  scheduler.pt  rng.pt
        state.json        {"step": N, ...}: the step and whatever else the loop needs (its data position)

A checkpoint is written under a temporary name, fsynced and renamed, with a manifest of its files,
their sizes and SHA-256, written last (RunFolder.write_checkpoint_half), so a resumed run never loads
a partial or damaged one: it falls back to the newest whole one (RunFolder.resume_step).
Shared by the trainers: nothing here knows about SFT or RL. A model sharded with FSDP (fsdp.py)
writes the same files as an unsharded one, so either resumes the other's checkpoints.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import peft
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from lorarl.run_folder import RunFolder
from lorarl.trainer.distributed import is_main_process
from lorarl.trainer.fsdp import gathered_optimizer_state, gathered_weights, is_sharded, load_optimizer_state
from lorarl.trainer.model import save_adapter

log = logging.getLogger("lorarl.checkpoint")


def save_checkpoint(
    run: RunFolder,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    keep_last: int | None = None,
) -> Path | None:
    """Write the checkpoint of `step` (of a PEFT model: its active adapter; `state` is saved beside
    the step in state.json), then delete all but the newest `keep_last` checkpoints. Call it on
    every rank: a sharded model gathers its weights and optimizer state from all of them. Rank 0
    alone writes, and returns the folder."""
    weights = gathered_weights(model)
    optimizer_state = gathered_optimizer_state(model, optimizer) if is_sharded(model) else optimizer.state_dict()
    if not is_main_process():
        return None

    def write(folder: Path) -> None:
        if isinstance(model, peft.PeftModel):
            save_adapter(model, folder / "adapter", weights)
        elif weights is not None:
            save_file(weights, str(folder / "model.safetensors"))
        else:
            save_model(model, str(folder / "model.safetensors"))
        torch.save(optimizer_state, folder / "optimizer.pt")
        torch.save(scheduler.state_dict(), folder / "scheduler.pt")
        torch.save(_rng_state(), folder / "rng.pt")
        (folder / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))

    dest = run.write_checkpoint_half(step, "trainer", write)
    if keep_last is not None:
        for old in run.checkpoint_steps()[:-keep_last]:
            run.remove_checkpoint(old)
    return dest


def find_checkpoint(run: RunFolder, step: int | None) -> Path:
    """The trainer checkpoint folder of `step` (None: the latest). Resuming restores it in two parts:
    `load_weights` into the model (before FSDP shards it), then `load_training_state`."""
    return run.trainer_checkpoint(run.resume_step(step))


def load_weights(folder: Path, model: torch.nn.Module) -> None:
    """The checkpoint's adapter (into the model's active one), or every weight, into the model: the
    unsharded one, built as for the run that wrote it."""
    if isinstance(model, peft.PeftModel):
        weights = load_file(folder / "adapter" / "adapter_model.safetensors")
        # torch's load_state_dict result; into the active adapter, as `save_checkpoint` saved it
        result: Any = peft.set_peft_model_state_dict(model, weights, adapter_name=model.active_adapter)
        if result.unexpected_keys:
            raise ValueError(f"{folder}: adapter weights that the model lacks: {result.unexpected_keys[:5]}")
    else:
        load_model(model, str(folder / "model.safetensors"))


def load_training_state(
    folder: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """The checkpoint's optimizer (of `model`, sharded or not: on every rank), scheduler and RNG
    states. Returns its state.json."""
    optimizer_state = torch.load(folder / "optimizer.pt", weights_only=True)
    if is_sharded(model):
        load_optimizer_state(model, optimizer, optimizer_state)
    else:
        optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    _set_rng_state(torch.load(folder / "rng.pt", weights_only=True))
    log.info("resumed from %s", folder)
    return json.loads((folder / "state.json").read_text())


def _rng_state() -> dict[str, Any]:
    # LoRA dropout draws from torch's generators; the data order has its own seeded state.
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
