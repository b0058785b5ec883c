"""`merge --base MODEL --adapter ADAPTER --out FOLDER`: fold a LoRA adapter into its base model.

Writes one Hugging Face model folder (weights, config, tokenizer) that transformers and vLLM load
like any model, e.g. the result of `sft` (`<run>/final`) or an RL broadcast (`broadcasts/step_N`).
The merge is computed in float32 and saved in the base model's dtype unless `--dtype` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from lorarl.cli.common import setup_logging
from lorarl.launcher.preflight import PreflightError, check_model

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="merge", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--base", required=True, help="the base model folder (or hub id) the adapter was trained on")
    parser.add_argument("--adapter", required=True, type=Path, help="a PEFT LoRA adapter folder")
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="the model folder to write: new or empty, or an earlier merge output with --overwrite",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds an earlier merge output")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: the base model's")
    args = parser.parse_args(argv)
    setup_logging("merge")
    try:
        merge(args.base, args.adapter, args.out, args.dtype, args.overwrite)
    except (FileNotFoundError, ValueError, PreflightError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
