"""The README's config reference names every option of `rl` and `sft`."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from lorarl.config.models import RLConfig, SFTConfig

README = (Path(__file__).parents[2] / "README.md").read_text()


def options(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Dotted paths of the settable leaves (sections are tables, not options)."""
    for name, field in model.model_fields.items():
        if field.exclude:  # e.g. --dry-run, a flag rather than a setting
            continue
        sections = [
            t for a in (field.annotation, *typing.get_args(field.annotation))
            for t in (a, *typing.get_args(a)) if isinstance(t, type) and issubclass(t, BaseModel)
        ]  # fmt: skip
        if sections:
            for section in sections:
                yield from options(section, f"{prefix}{name}.")
        else:
            yield prefix + name


@pytest.mark.parametrize("config", [RLConfig, SFTConfig])
def test_readme_names_every_option(config: type[BaseModel]) -> None:
    paths = sorted(set(options(config)))
    assert "orchestrator.max_off_policy_steps" in paths or config is SFTConfig  # the walk reaches leaves
    missing = [p for p in paths if f"`{p.rsplit('.', 1)[-1]}`" not in README and p not in README]
    assert not missing, f"options missing from README.md's config reference: {missing}"
