"""Write a policy version for the orchestrator to hand to vLLM: a PEFT adapter folder (LoRA), or with
model.full_finetune a whole model folder (safetensors) that the workers reload in place."""

from __future__ import annotations

import json
from pathlib import Path

import peft

from lorarl.run_folder import PROBE_FILE, UPDATED_AT, write_folder_atomically
from lorarl.trainer.distributed import is_main_process
from lorarl.trainer.fsdp import gathered_weights
from lorarl.trainer.model import TrainedModel, save_adapter
from lorarl.trainer.served_probe import probe_file_text


def write_policy(model: TrainedModel, folder: Path, updated_at: float | None = None) -> None:
    """The active adapter's adapter_model.safetensors + adapter_config.json (that vLLM and
    `PeftModel.from_pretrained` load), or every weight as save_pretrained writes them, renamed into
    place, then STABLE. Call it on every rank: a sharded model gathers its weights from all of them.
    Rank 0 alone writes.
    `updated_at`: when the optimizer step that made these weights ended (time.time()), written beside
    them so that the orchestrator can tell how long the hand-off to vLLM took (perf/adapter_live_s).
    With the served-adapter check, the probe's logprobs under these weights go beside them (served_probe.py)."""
    weights = gathered_weights(model)
    probe = probe_file_text(model)
    if not is_main_process():
        return

    def write(tmp: Path) -> None:
        if isinstance(model, peft.PeftModel):
            save_adapter(model, tmp, weights)
        else:
            model.save_pretrained(str(tmp), state_dict=weights)
        if updated_at is not None:
            (tmp / UPDATED_AT).write_text(json.dumps({"time": updated_at}))
        if probe is not None:
            (tmp / PROBE_FILE).write_text(probe)

    write_folder_atomically(folder, write, stable_marker=True)
