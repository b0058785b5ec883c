"""`rl --help` and `sft --help` explain every option, not only its default."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.config.sft import SFTConfig


def option_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The dotted flag of every option; a list of sections ([[orchestrator.env]]) is one JSON flag."""
    for name, field in model.model_fields.items():
        members = () if typing.get_origin(field.annotation) is list else typing.get_args(field.annotation)
        sections = [t for t in (field.annotation, *members) if isinstance(t, type) and issubclass(t, BaseModel)]
        for section in sections:  # every type of a section chosen by `type`; their flags merge
            yield from option_paths(section, f"{prefix}{name}.")
        else:
            yield prefix + name


def help_texts(text: str) -> dict[str, str]:
    """Each flag's help as argparse prints it, joined into one line, without "(default: ...)"."""
    helps: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        if line.startswith("  -"):
            invocation, _, first = line.strip().partition("  ")
            flag = re.findall(r"--([\w.]+)", invocation)[0]
            helps[flag] = first.strip()
        elif flag is not None and line.startswith(" " * 24):
            helps[flag] += " " + line.strip()
        else:
            flag = None
    return {flag: re.sub(r"\s*\((default: .*|required)\)$", "", h).strip() for flag, h in helps.items()}


@pytest.mark.parametrize("config", [RLConfig, SFTConfig])
def test_help_explains_every_option(config: type[BaseModel], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load_config(config, ["--help"])
    assert exc.value.code == 0
    helps = help_texts(capsys.readouterr().out)
    paths = list(option_paths(config))
    assert "orchestrator.sampling.top_p" in paths or config is SFTConfig  # the walk reaches nested options
    unexplained = [path for path in paths if not helps.get(path)]
    assert not unexplained, f"--help shows no text for: {unexplained}"
