"""Fold a LoRA adapter into its base model: one Hugging Face model folder (weights, config,
tokenizer) that transformers and vLLM load like any model, e.g. from the result of `sft`
(`<run>/final`) or an RL broadcast (`broadcasts/step_N`). The merge is computed in float32 and
saved in the base model's dtype unless asked otherwise. The output folder is checked before
anything loads: only a new, empty or earlier merge folder is ever written.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from lorarl.launcher.preflight import check_model

log = logging.getLogger("lorarl.merge")
# Written into every merge output: only a folder with it may be replaced (with --overwrite).
MERGE_MARKER = "lorarl-merge.json"


def check_out(base: str, adapter: Path, out: Path, overwrite: bool) -> None:
    """`out` is a new folder, an empty one, or (with `overwrite`) an earlier merge output; and it
    neither is, holds nor lies inside the base model or the adapter."""
    target = out.resolve()
    for name, source in (("--base", Path(base)), ("--adapter", adapter)):
        if source.exists() and (target == source.resolve() or source.resolve().is_relative_to(target)
                                or target.is_relative_to(source.resolve())):  # fmt: skip
            raise ValueError(f"--out {out} overlaps {name} {source}: write the merged model to a folder of its own")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MERGE_MARKER).is_file():
            raise ValueError(f"--out {out} is not empty and is not an earlier merge output: it is left untouched")
        if not overwrite:
            raise ValueError(f"--out {out} holds an earlier merge: add --overwrite to replace it")


def merge(base: str, adapter: Path, out: Path, dtype: str | None = None, overwrite: bool = False) -> Path:
    """Write base + adapter to `out` as one model folder, with the adapter's tokenizer if it has
    one (`sft` saves it beside the adapter), else the base model's."""
    import peft
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lorarl.run_folder import write_folder_atomically

    check_model(base, "--base")
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"--adapter {adapter}: not a PEFT adapter folder (no adapter_config.json)")
    check_out(base, adapter, out, overwrite)
    out_dtype = getattr(torch, dtype) if dtype else AutoConfig.from_pretrained(base).dtype or torch.float32
    # float32 so that W + scale * B @ A is not rounded twice on a bfloat16 base.
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().to(out_dtype)
    has_tokenizer = (adapter / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(adapter if has_tokenizer else base)

    def write(folder: Path) -> None:
        merged.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / MERGE_MARKER).write_text(json.dumps({"base": base, "adapter": str(adapter)}) + "\n")

    write_folder_atomically(out, write)
    log.info("wrote %s (%s + %s, %s)", out, base, adapter, str(out_dtype).removeprefix("torch."))
    return out
