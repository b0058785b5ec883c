"""`sft @ cfg.toml`: supervised fine-tuning (LoRA from [model.lora], or full without it).

With `--parallel.dp N` it starts itself again under torchrun as N data-parallel ranks.
"""

from __future__ import annotations

import os
import sys

from lorarl.cli.common import load_or_exit, setup_logging
from lorarl.config.models import SFTConfig
from lorarl.launcher.plan import torchrun


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    cfg = load_or_exit(SFTConfig, args)
    if cfg.parallel.dp > 1 and "WORLD_SIZE" not in os.environ:
        os.execv(sys.executable, [*torchrun(cfg.parallel.dp), "-m", "lorarl.cli.sft", *args])
    setup_logging("sft")
    from lorarl.trainer.sft import train  # torch and transformers load only once the config is valid

    train(cfg)


if __name__ == "__main__":
    main()
