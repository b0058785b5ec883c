"""Fold a LoRA adapter into its base model: one Hugging Face model folder (weights, config,
tokenizer) that transformers and vLLM load like any model, e.g. from the result of `sft`
(`<run>/final`) or an RL broadcast (`broadcasts/step_N`). The merge is computed in float32 and
saved in the base model's dtype unless asked otherwise. An adapter trained on a 4-bit base
(model.quantization) is merged into the full-precision base, and the merge says so. The output folder
is checked before anything loads: only a new, empty or earlier merge folder is ever written, never
through a link. An earlier merge is replaced by the files its MANIFEST.json lists (the record of what
lorarl wrote there): a file a user added stays, unless the new merge writes one of that name, which is
refused.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from lorarl.launcher.preflight import check_model
from lorarl.run_folder import unwritable
from lorarl.written_files import MANIFEST, foreign_files, link_in_way, link_refusal

log = logging.getLogger("lorarl.merge")
# Written into every merge output: only a folder with it may be replaced (with --overwrite).
MERGE_MARKER = "lorarl-merge.json"
# Names a merge may write (transformers' model and tokenizer files): a user's file of such a name in an
# earlier merge is refused before anything loads. Any other clash is refused when the new folder is ready.
_MODEL_FILE = re.compile(
    r"(config|generation_config|special_tokens_map|added_tokens)\.json|.*\.safetensors(\.index\.json)?|"
    r"pytorch_model.*\.bin|tokenizer.*|vocab\..*|merges\.txt|chat_template\.jinja"
)


def check_out(base: str, adapter: Path, out: Path, overwrite: bool) -> None:
    """`out` is a new folder, an empty one, or (with `overwrite`) an earlier merge output; and it
    neither is, holds nor lies inside the base model or the adapter."""
    if problem := unwritable(out.parent) or unwritable(out):
        raise ValueError(f"--out {out}: {problem}")
    if (link := link_in_way(out)) is not None:  # it would move the files behind it (an earlier merge's)
        raise ValueError(f"--out {out}: {link_refusal(link)}")
    target = out.resolve()
    for name, source in (("--base", Path(base)), ("--adapter", adapter)):
        if source.exists() and (
            target == source.resolve()
            or source.resolve().is_relative_to(target)
            or target.is_relative_to(source.resolve())
        ):
            raise ValueError(f"--out {out} overlaps {name} {source}: write the merged model to a folder of its own")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MERGE_MARKER).is_file():
            raise ValueError(f"--out {out} is not empty and is not an earlier merge output: it is left untouched")
        if not overwrite:
            raise ValueError(f"--out {out} holds an earlier merge: add --overwrite to replace it")
        foreign = foreign_files(out)
        if out / MERGE_MARKER in foreign:
            raise ValueError(
                f"--out {out} holds an earlier merge with no record of its files ({MANIFEST}): lorarl cannot tell "
                "them from yours and leaves them; move them away, or write to another folder"
            )
        if clash := next((p for p in foreign if _MODEL_FILE.fullmatch(p.name)), None):
            raise ValueError(
                f"--out {out}: {clash.name} there is not in the earlier merge's {MANIFEST} (lorarl did not write it) "
                "and a merge writes a file of that name: it is left untouched; move it away, or write elsewhere"
            )


def merge(base: str, adapter: Path, out: Path, dtype: str | None = None, overwrite: bool = False) -> Path:
    """Write base + adapter to `out` as one model folder, with the adapter's tokenizer if it has
    one (`sft` saves it beside the adapter), else the base model's."""
    import peft
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from lorarl.quantized_base import BASE_NOTE
    from lorarl.run_folder import write_folder_atomically

    check_model(base, "--base")
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"--adapter {adapter}: not a PEFT adapter folder (no adapter_config.json)")
    check_out(base, adapter, out, overwrite)
    transformers_logging.disable_progress_bar()  # a refusal found while writing stays one line
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
    if (adapter / BASE_NOTE).is_file():
        # model.quantization: the adapter learned on the 4-bit base; merged, it sits on the weights it rounded.
        log.info("%s was trained on a 4-bit (nf4) base: merged into the full-precision base %s", adapter, base)
    log.info("wrote %s (%s + %s, %s)", out, base, adapter, str(out_dtype).removeprefix("torch."))
    return out
