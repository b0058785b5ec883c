"""`merge --base MODEL --adapter ADAPTER --out FOLDER`: fold a LoRA adapter into its base model.

Writes one Hugging Face model folder (weights, config, tokenizer) that transformers and vLLM load
like any model, e.g. the result of `sft` (`<run>/final`) or an RL broadcast (`broadcasts/step_N`).
The merge is computed in float32 and saved in the base model's dtype unless `--dtype` says otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from lorarl.cli.common import setup_logging

log = logging.getLogger("lorarl.merge")


def merge(base: str, adapter: Path, out: Path, dtype: str | None = None) -> Path:
    """Write base + adapter to `out` as one model folder, with the adapter's tokenizer if it has
    one (`sft` saves it beside the adapter), else the base model's."""
    import peft
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lorarl.run_folder import write_folder_atomically

    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter}: not a PEFT adapter folder (no adapter_config.json)")
    out_dtype = getattr(torch, dtype) if dtype else AutoConfig.from_pretrained(base).dtype or torch.float32
    # float32 so that W + scale * B @ A is not rounded twice on a bfloat16 base.
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().to(out_dtype)
    has_tokenizer = (adapter / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(adapter if has_tokenizer else base)

    def write(folder: Path) -> None:
        merged.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    out.parent.mkdir(parents=True, exist_ok=True)
    write_folder_atomically(out, write)
    log.info("wrote %s (%s + %s, %s)", out, base, adapter, str(out_dtype).removeprefix("torch."))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="merge", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--base", required=True, help="the base model folder (or hub id) the adapter was trained on")
    parser.add_argument("--adapter", required=True, type=Path, help="a PEFT LoRA adapter folder")
    parser.add_argument("--out", required=True, type=Path, help="the model folder to write (replaced if it exists)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: the base model's")
    args = parser.parse_args(argv)
    setup_logging("merge")
    try:
        merge(args.base, args.adapter, args.out, args.dtype)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
