"""What every entry point does first: load its config or explain why not, and set up logging."""

from __future__ import annotations

import logging
import os
import sys
from typing import TypeVar

from pydantic import BaseModel

from lorarl.config.loader import ConfigError, load_config

T = TypeVar("T", bound=BaseModel)


def load_or_exit(cls: type[T], argv: list[str] | None) -> T:
    try:
        return load_config(cls, argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def setup_logging(component: str) -> None:
    logging.basicConfig(
        level=os.environ.get("LORARL_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {component} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
