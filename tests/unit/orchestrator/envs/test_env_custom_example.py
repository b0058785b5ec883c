"""examples/custom_environment: the user's-own-environment example loads as its config names it."""

import asyncio
import random
import subprocess
import sys

import pytest

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.orchestrator.envs import load_environment
from tests.conftest import REPO
from tests.unit.orchestrator.envs.env_play import play_by_hand

CONFIG = REPO / "examples" / "custom_environment" / "rl.toml"
CONFIG_ID = "examples.custom_environment.my_env:make_env"


@pytest.fixture
def env_cfg(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(REPO))  # what `python -m` gives the orchestrator started from the repo root
    (cfg,) = load_config(RLConfig, ["@", str(CONFIG)]).orchestrator.env
    assert cfg.id == CONFIG_ID
    return cfg


def test_the_example_loads_as_configured_and_scores(env_cfg) -> None:
    env = load_environment(env_cfg.id, env_cfg.args)
    assert env.name == "count_letter" and env.max_turns == env_cfg.args["max_attempts"] == 2
    example = next(env.examples(random.Random(0)))
    right, wrong = str(example["count"]), str(example["count"] + 1)

    def reward(answers: list[str]) -> float:
        return asyncio.run(env.score(play_by_hand(env, example, answers)))["reward"]

    assert reward([env.solution(example)]) == pytest.approx(1.1)
    assert play_by_hand(env, example, [right, "again?"]).turns == [right]  # right: the episode ends
    assert play_by_hand(env, example, [wrong, right]).messages[-2]["content"] == "That is not right. Try again."
    assert reward([wrong, right]) == pytest.approx(0.5 + 0.1)
    assert reward([wrong, wrong]) == pytest.approx(0.1)
    assert reward(["I count three."]) == 0.0


def test_bad_args_are_clear_errors(env_cfg) -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        load_environment(env_cfg.id, {"max_attempts": 0})


@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_the_module_path_resolves_from_the_repo_root_in_a_fresh_interpreter() -> None:
    # `rl` starts the orchestrator as `python -m ...` in the current directory; `-c` puts the
    # current directory on sys.path the same way.
    code = f"from lorarl.orchestrator.envs import load_environment; print(load_environment({CONFIG_ID!r}).name)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "count_letter"
