"""Write the adapter as a PEFT folder that vLLM and `PeftModel.from_pretrained` load."""

from __future__ import annotations

from pathlib import Path

import peft

from lorarl.run_folder import write_folder_atomically
from lorarl.trainer.distributed import is_main_process
from lorarl.trainer.fsdp import gathered_weights
from lorarl.trainer.model import save_adapter


def write_adapter(model: peft.PeftModel, folder: Path) -> None:
    """The active adapter's adapter_model.safetensors + adapter_config.json, renamed into place, then
    STABLE. Call it on every rank: a sharded model gathers its adapter from all of them. Rank 0 alone writes."""
    weights = gathered_weights(model)
    if not is_main_process():
        return
    write_folder_atomically(folder, lambda tmp: save_adapter(model, tmp, weights), stable_marker=True)
