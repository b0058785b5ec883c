"""`trainer @ cfg.toml`: the RL trainer alone (reads [model], [trainer] and the top-level keys)."""

from __future__ import annotations

from lorarl.cli.common import load_or_exit, setup_logging
from lorarl.config.models import RLConfig


def main(argv: list[str] | None = None) -> None:
    cfg = load_or_exit(RLConfig, argv)
    setup_logging("trainer")
    from lorarl.trainer.rl import train

    train(cfg)


if __name__ == "__main__":
    main()
