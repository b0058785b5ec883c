"""The public API: `lorarl`'s top level is what users import, and all that examples and docs import.

Every exported name resolves, at run time and for the API reference (griffe, which mkdocstrings
reads the package with, statically), to a documented object; user code built on the public names
runs through the internals that check it; `import lorarl` stays cheap; and no example, shipped
config or docs snippet reaches into `lorarl.<module>`, whose paths are internal.
"""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import griffe
import pytest

import lorarl
from lorarl.config.algorithms import CustomAdvantage
from lorarl.orchestrator.advantages import advantage_estimator
from lorarl.orchestrator.envs import load_environment

ROOT = Path(__file__).resolve().parents[2]
# An import of a module inside lorarl, in Python code or a shell line that runs Python.
DEEP_IMPORT = re.compile(r"^\s*(?:from\s+lorarl\.\w[\w.]*\s+import\b|import\s+lorarl\.\w)", re.MULTILINE)
# A config value naming a function inside lorarl ("lorarl.module:function", e.g. loss_fn or an env id).
DEEP_PLUGIN_REF = re.compile(r"""=\s*["']lorarl\.[\w.]+:\w+["']""")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def api() -> griffe.Module:
    """The package as the API reference reads it: statically, its aliases resolved."""
    module = griffe.load("lorarl", search_paths=[str(ROOT / "src")], resolve_aliases=True)
    assert isinstance(module, griffe.Module)
    return module


def test_every_public_name_resolves() -> None:
    assert len(set(lorarl.__all__)) == len(lorarl.__all__)
    for name in lorarl.__all__:
        assert getattr(lorarl, name) is not None, name
    assert set(lorarl.__all__) <= set(dir(lorarl))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = lorarl.nothing  # type: ignore[attr-defined]


def test_the_api_reference_sees_every_public_name_with_its_docstring(api: griffe.Module) -> None:
    assert api.exports == lorarl.__all__
    for name in lorarl.__all__:
        member = api.members[name]
        # The static import (TYPE_CHECKING) and the lazy table name the same definition.
        if name != "plugin":
            assert member.is_alias and member.target_path == f"{lorarl._LAZY[name]}.{name}", name
        docstring = member.docstring
        assert docstring is not None and docstring.value.strip(), f"lorarl.{name} has no docstring"


def test_the_package_docstring_says_the_rest_is_internal() -> None:
    assert lorarl.__doc__ is not None and "internal" in lorarl.__doc__


def test_import_lorarl_imports_neither_torch_nor_transformers() -> None:
    probe = "import sys, lorarl; print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class Double(lorarl.Environment):
    """A user's environment built only on public names: double a number."""

    name = "double"
    rewards = [lorarl.WeightedReward(lambda episode: float(episode.completion == str(2 * episode.example["n"])))]

    def examples(self, rng: random.Random) -> Iterator[lorarl.Example]:
        while True:
            yield {"n": rng.randint(1, 9)}

    def prompt(self, example: lorarl.Example) -> list[lorarl.Message]:
        return [{"role": "user", "content": f"Double {example['n']}."}]


def test_a_public_environment_is_what_the_internals_load_and_score() -> None:
    env = load_environment(f"{__name__}:Double")  # internally checked with isinstance(env, Environment)
    assert isinstance(env, Double)
    example = next(env.examples(random.Random(0)))
    right = lorarl.Episode(example, [*env.prompt(example), {"role": "assistant", "content": str(2 * example["n"])}])
    assert asyncio.run(env.score(right))["reward"] == 1.0
    assert lorarl.load_environment is load_environment


@lorarl.plugin("advantage")
def centered(rewards: list[float]) -> list[float]:
    """An advantage function of the rewards alone."""
    return [r - sum(rewards) / len(rewards) for r in rewards]


@lorarl.plugin("advantage")
def by_length(rewards: list[float], episodes: list[lorarl.PlayedEpisode]) -> list[float]:
    """An advantage function that reads the episodes too: the reward less the length in tokens."""
    return [r - e.model_tokens for r, e in zip(rewards, episodes, strict=True)]


def test_advantage_functions_of_either_form_are_called_as_declared() -> None:
    episode = lorarl.Episode({}, [])
    played = [lorarl.PlayedEpisode(episode, [], model_tokens=n, truncated=False) for n in (1, 2)]
    one = advantage_estimator(CustomAdvantage(fn=f"{__name__}:centered"))
    two = advantage_estimator(CustomAdvantage(fn=f"{__name__}:by_length"))
    assert one([1.0, 0.0], played) == [0.5, -0.5]
    assert two([1.0, 0.0], played) == [0.0, -2.0]


def _user_facing_files(*patterns: str) -> list[Path]:
    return sorted(p for pattern in patterns for p in ROOT.glob(pattern) if ".venv" not in p.parts)


def _deep_imports(text: str) -> list[str]:
    return [m.group(0).strip() for m in DEEP_IMPORT.finditer(text)]


def test_examples_import_only_the_public_api() -> None:
    files = _user_facing_files("examples/**/*.py")
    assert files
    found = {str(p.relative_to(ROOT)): _deep_imports(p.read_text()) for p in files}
    assert {path: hits for path, hits in found.items() if hits} == {}


def test_docs_snippets_import_only_the_public_api() -> None:
    files = _user_facing_files("README.md", "docs/**/*.md", "examples/**/*.md")
    assert len(files) > 3
    found = {
        str(p.relative_to(ROOT)): [hit for block in FENCED.findall(p.read_text()) for hit in _deep_imports(block)]
        for p in files
    }
    assert {path: hits for path, hits in found.items() if hits} == {}


def test_configs_name_no_function_inside_lorarl() -> None:
    files = _user_facing_files("configs/**/*.toml", "examples/**/*.toml")
    assert files
    found = {str(p.relative_to(ROOT)): DEEP_PLUGIN_REF.findall(p.read_text()) for p in files}
    assert {path: hits for path, hits in found.items() if hits} == {}


@pytest.mark.parametrize(
    ("text", "hits"),
    [
        ("from lorarl.orchestrator.envs.base import Episode", 1),
        ("    import lorarl.trainer.loss as loss", 1),
        ("from lorarl import Environment\nimport lorarl\n@lorarl.plugin('loss')", 0),
        ("python -m lorarl.tiny_model out", 0),
    ],
)
def test_deep_imports_are_told_from_public_ones(text: str, hits: int) -> None:
    assert len(_deep_imports(text)) == hits


def test_plugin_refs_inside_lorarl_are_told_from_the_users() -> None:
    assert DEEP_PLUGIN_REF.findall('loss_fn = "lorarl.trainer.loss:policy_loss"')
    assert not DEEP_PLUGIN_REF.findall('id = "examples.custom_environment.my_env:make_env"')
