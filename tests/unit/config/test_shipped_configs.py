"""Every TOML shipped in the repo parses with the config class its entry point uses."""

from pathlib import Path

import pytest

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.config.serve import ServeConfig
from lorarl.config.sft import SFTConfig
from tests.conftest import REPO

SHIPPED = sorted(p for d in ("configs", "examples") for p in (REPO / d).rglob("*.toml"))


def test_the_repo_ships_configs() -> None:
    assert REPO / "configs" / "quickstart" / "rl.toml" in SHIPPED
    assert REPO / "configs" / "quickstart" / "sft.toml" in SHIPPED
    assert REPO / "configs" / "serve" / "quickstart.toml" in SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_config_parses(path: Path) -> None:
    cls = SFTConfig if path.stem.startswith("sft") else ServeConfig if "serve" in path.parts else RLConfig
    assert isinstance(load_config(cls, ["@", str(path)]), cls)
