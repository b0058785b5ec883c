"""`sft @ cfg.toml`: supervised fine-tuning (LoRA from [model.lora], or full without it)."""

from __future__ import annotations

from lorarl.cli.common import load_or_exit, setup_logging
from lorarl.config.models import SFTConfig


def main(argv: list[str] | None = None) -> None:
    cfg = load_or_exit(SFTConfig, argv)
    setup_logging("sft")
    from lorarl.trainer.sft import train  # torch and transformers load only once the config is valid

    train(cfg)


if __name__ == "__main__":
    main()
