"""The recipes scripts/learning_check.py runs: each warm-up stage starts from the model the stage
before wrote, the first from a local model the script builds, and rl.toml from the last stage's."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def script(name: str) -> ModuleType:
    """scripts/<name>.py as a module; scripts/ is on the path while it loads, as when run as a script."""
    sys.path.insert(0, str(REPO / "scripts"))  # learning_check imports run_steps beside it
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "scripts"))


def learning_check() -> ModuleType:
    return script("learning_check")


def test_calculator_warms_up_in_two_stages_the_others_in_one() -> None:
    check = learning_check()
    stages = {recipe: check.warmup_stages(check.folder(recipe)) for recipe in check.recipes()}
    assert [p.name for p in stages.pop("calculator")] == ["sft_copy.toml", "sft.toml"]
    assert stages and all([p.name for p in chain] == ["sft.toml"] for chain in stages.values())


@pytest.mark.parametrize("recipe", learning_check().recipes())
def test_each_stage_starts_where_the_one_before_ended(recipe: str) -> None:
    check = learning_check()
    stages = [check.read_toml(p) for p in check.warmup_stages(check.folder(recipe))]
    assert stages[0]["model"]["name"] in script("run_steps").LOCAL_MODELS
    for before, after in itertools.pairwise(stages):
        assert after["model"]["name"] == check.final_model(before)
    assert check.read_toml(check.folder(recipe) / "rl.toml")["model"]["name"] == check.final_model(stages[-1])
    # Every stage's data is its own file: learning_check writes it only where it is missing.
    assert len({s["data"]["path"] for s in stages}) == len(stages)


def test_a_stage_chain_follows_model_names_not_file_names(tmp_path: Path) -> None:
    def write(name: str, model: str, run_name: str) -> None:
        (tmp_path / name).write_text(f'run_name = "{run_name}"\n[model]\nname = "{model}"\n')

    write("sft.toml", "outputs/b/final", "c")
    write("sft_a.toml", "outputs/models/tiny-qwen3", "a")
    write("sft_b.toml", "outputs/a/final", "b")
    write("sft_other.toml", "outputs/models/tiny-qwen3", "other")  # not on the chain
    assert [p.name for p in learning_check().warmup_stages(tmp_path)] == ["sft_a.toml", "sft_b.toml", "sft.toml"]
