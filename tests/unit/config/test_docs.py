"""docs/config.md, the config reference, is the one scripts/config_reference.py generates from the
config models' field docstrings, and every option has such a docstring."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from lorarl.config.run import RLConfig
from lorarl.config.sft import SFTConfig
from tests.conftest import REPO


def generator() -> ModuleType:
    path = REPO / "scripts" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("config_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_config_reference_is_generated() -> None:
    gen = generator()
    assert (REPO / "docs" / "config.md").read_text() == gen.reference(), (
        f"docs/config.md differs from the config models: run `{gen.WRITE}`"
    )


@pytest.mark.parametrize("config", [RLConfig, SFTConfig])
def test_every_option_has_a_description(config: type[BaseModel]) -> None:
    undocumented = [
        f"{section.model.__name__}.{name}"
        for section in generator().sections(config)
        for name, field in section.model.model_fields.items()
        if not (field.description or "").strip()
    ]
    assert not undocumented, f"give these fields a docstring (a string right after the field): {undocumented}"


def test_sft_optim_lists_its_own_default() -> None:
    assert "* `[optim]`: as `[trainer.optim]`, but `lr = 0.001`" in generator().reference()


def test_defaults_render_as_toml() -> None:
    toml = generator().toml
    defaults: list[object] = [None, True, "float32", Path("outputs"), [], (0.9, 0.999), 5e-5, {"a": 1}]
    assert [toml(v) for v in defaults] == [
        "none", "true", '"float32"', '"outputs"', "[]", "[0.9, 0.999]", "5e-05", "{a = 1}"
    ]  # fmt: skip
