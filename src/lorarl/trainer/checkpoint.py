"""Trainer checkpoints: everything needed to continue a run exactly where it stopped.

    <run_dir>/checkpoints/step_N/trainer/
        adapter/          a PEFT adapter folder (LoRA; usable as model.lora.init_adapter), or
        model.safetensors every weight (full fine-tuning)
        optimizer.pt  scheduler.pt  rng.pt
        state.json        {"step": N, ...}: the step and whatever else the loop needs (its data position)

A checkpoint is written under a temporary name and renamed, so a folder named `trainer/` is
complete. Shared by the trainers: nothing here knows about SFT or RL.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import peft
import torch
from safetensors.torch import load_file, load_model, save_model

from lorarl.run_folder import step_folders, write_folder_atomically

log = logging.getLogger("lorarl.checkpoint")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step}" / "trainer"


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps with a complete checkpoint, oldest first."""
    steps = step_folders(Path(run_dir) / "checkpoints")
    return sorted(s for s in steps if (checkpoint_dir(run_dir, s) / "state.json").is_file())


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    keep_last: int | None = None,
) -> Path:
    """Write the checkpoint of `step` (`state` is saved beside the step in state.json), then delete
    all but the newest `keep_last` checkpoints."""

    def write(folder: Path) -> None:
        if isinstance(model, peft.PeftModel):
            model.save_pretrained(str(folder / "adapter"))
        else:
            save_model(model, str(folder / "model.safetensors"))
        torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        torch.save(scheduler.state_dict(), folder / "scheduler.pt")
        torch.save(_rng_state(), folder / "rng.pt")
        (folder / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))

    dest = checkpoint_dir(run_dir, step)
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_folder_atomically(dest, write)
    if keep_last is not None:
        for old in checkpoint_steps(run_dir)[:-keep_last]:
            shutil.rmtree(checkpoint_dir(run_dir, old).parent)
    return dest


def load_checkpoint(
    run_dir: Path,
    step: int | None,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Restore the checkpoint of `step` (None: the latest) into the objects, which must be built
    as for the run that wrote it, and the RNG states. Returns its state.json."""
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"no checkpoint to resume from in {Path(run_dir) / 'checkpoints'}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise FileNotFoundError(f"no checkpoint of step {step} in {Path(run_dir) / 'checkpoints'} (there are {steps})")
    folder = checkpoint_dir(run_dir, step)
    if isinstance(model, peft.PeftModel):
        weights = load_file(folder / "adapter" / "adapter_model.safetensors")
        result: Any = peft.set_peft_model_state_dict(model, weights)  # torch's load_state_dict result
        if result.unexpected_keys:
            raise ValueError(f"{folder}: adapter weights that the model lacks: {result.unexpected_keys[:5]}")
    else:
        load_model(model, str(folder / "model.safetensors"))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    _set_rng_state(torch.load(folder / "rng.pt", weights_only=True))
    log.info("resumed from %s", folder)
    return json.loads((folder / "state.json").read_text())


def discard_after(run_dir: Path, step: int, metrics: Path) -> None:
    """Forget what a run wrote after `step`, before it continues from there: later checkpoints,
    and metrics rows of later steps (the resumed run writes them again)."""
    for later in (s for s in checkpoint_steps(run_dir) if s > step):
        shutil.rmtree(checkpoint_dir(run_dir, later).parent)
        log.info("removed checkpoint step_%d, written after the step resumed from", later)
    if metrics.is_file():
        lines = metrics.read_text().splitlines(keepends=True)
        metrics.write_text("".join(line for line in lines if _row_step(line) <= step))


def _row_step(line: str) -> float:
    try:
        return float(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return float("inf")  # a line cut short by the crash the run resumes from


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
