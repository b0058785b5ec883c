"""`lorarl-merge --base MODEL --adapter ADAPTER --out FOLDER`: fold a LoRA adapter into its base model.

Writes one Hugging Face model folder (weights, config, tokenizer) that transformers and vLLM load
like any model, e.g. the result of `sft` (`<run>/final`) or an RL broadcast (`broadcasts/step_N`).
The merge is computed in float32 and saved in the base model's dtype unless `--dtype` says otherwise.
"""

from __future__ import annotations

import argparse

from lorarl.cli.common import ArgumentParser, ctrl_c_in_one_line, exit_with, setup_logging, user_path
from lorarl.config.common import expand_user
from lorarl.exit_codes import BAD_INPUT
from lorarl.launcher.preflight import PreflightError
from lorarl.merge import merge
from lorarl.run_folder import RunFolderError


@ctrl_c_in_one_line("lorarl-merge")
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="lorarl-merge", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--base", required=True, help="the base model folder (or hub id) the adapter was trained on")
    parser.add_argument("--adapter", required=True, type=user_path, help="a PEFT LoRA adapter folder")
    parser.add_argument(
        "--out",
        required=True,
        type=user_path,
        help="the model folder to write: new or empty, or an earlier merge output with --overwrite (which\n"
        "replaces the files the earlier merge wrote, listed in its MANIFEST.json, and keeps any other)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier merge output at --out")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: the base model's")
    args = parser.parse_args(argv)
    setup_logging("merge")
    try:
        # A "~user" the shell left as it stands (no such user) names no folder: refused, not created here.
        merge(expand_user(args.base), args.adapter, args.out, args.dtype, args.overwrite)
    except (OSError, ValueError, PreflightError, RunFolderError) as e:  # OSError: e.g. a file system refusing root
        exit_with(e, BAD_INPUT)


if __name__ == "__main__":
    main()
