"""`orchestrator @ cfg.toml`: the rollout loop alone (reads [model], [orchestrator], [inference])."""

from __future__ import annotations

import asyncio

from lorarl.cli.common import load_or_exit, setup_logging
from lorarl.config.models import RLConfig


def main(argv: list[str] | None = None) -> None:
    cfg = load_or_exit(RLConfig, argv)
    setup_logging("orchestrator")
    from lorarl.orchestrator.orchestrator import orchestrate

    asyncio.run(orchestrate(cfg))


if __name__ == "__main__":
    main()
