"""Write the adapter as a PEFT folder that vLLM and `PeftModel.from_pretrained` load."""

from __future__ import annotations

from pathlib import Path

import peft

from lorarl.run_folder import write_folder_atomically


def write_adapter(model: peft.PeftModel, folder: Path) -> None:
    """adapter_model.safetensors + adapter_config.json, renamed into place, then STABLE."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    write_folder_atomically(folder, lambda tmp: model.save_pretrained(str(tmp)), stable_marker=True)
