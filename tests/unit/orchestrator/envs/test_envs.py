import asyncio
import random

import pytest

from lorarl.orchestrator.advantages import dr_grpo, grpo
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Episode, WeightedReward
from lorarl.orchestrator.envs.reverse_text import ReverseText


def score(env, example: dict, completion: str) -> dict[str, float]:
    messages = [*env.prompt(example), {"role": "assistant", "content": completion}]
    return asyncio.run(env.score(Episode(example, messages)))


def test_reverse_text_rewards_right_partial_wrong_and_malformed() -> None:
    env = ReverseText()
    example = {"text": "green apple"}
    assert score(env, example, "elppa neerg")["reward"] == 1.0
    assert score(env, example, "  elppa neerg\n")["reward"] == 1.0  # surrounding whitespace is not an error
    partial = score(env, example, "elppa")["reward"]
    assert 0.4 < partial < 0.7
    assert score(env, example, "green apple")["reward"] < partial  # not reversed
    assert score(env, example, "")["reward"] == 0.0
    assert score(env, example, "<|im_end|>###")["reward"] < 0.2


class Flaky(Environment):
    name = "flaky"

    def __init__(self) -> None:
        async def async_ok(ep: Episode) -> float:
            return 1.0

        def broken(ep: Episode) -> float:
            raise RuntimeError("bug in a reward function")

        def not_a_number(ep: Episode) -> float:
            return float("nan")

        async def infinite(ep: Episode) -> float:
            return float("-inf")

        self.rewards = [WeightedReward(async_ok, 0.5), WeightedReward(broken, 2.0),
                        WeightedReward(not_a_number, 1.0), WeightedReward(infinite, 1.0)]  # fmt: skip

    def prompt(self, example: dict) -> list[dict[str, str]]:
        return [{"role": "user", "content": "q"}]


def test_async_rewards_and_a_raising_or_non_finite_reward_scores_zero_and_is_counted() -> None:
    scores = score(Flaky(), {}, "a")
    assert scores == {"async_ok": 1.0, "broken": 0.0, "not_a_number": 0.0, "infinite": 0.0, "reward": 0.5,
                      "reward_errors": 3}  # fmt: skip


def test_reverse_text_examples_are_reproducible_and_solved_by_solution() -> None:
    env = load_environment("reverse_text", {"min_words": 2, "max_words": 3})
    a = [next(env.examples(random.Random(7))) for _ in range(3)]
    b = [next(env.examples(random.Random(7))) for _ in range(3)]
    assert a == b
    for ex in a:
        assert 2 <= len(ex["text"].split()) <= 3
        assert score(env, ex, env.solution(ex))["reward"] == 1.0
        assert env.prompt(ex)[-1] == {"role": "user", "content": ex["text"]}


def test_unknown_environment_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        load_environment("nope")


def test_group_advantages() -> None:
    assert dr_grpo([1.0, 0.0, 0.5]) == [0.5, -0.5, 0.0]
    adv = grpo([1.0, 0.0])
    assert adv[0] == pytest.approx(1.0, abs=1e-5) and adv[1] == pytest.approx(-1.0, abs=1e-5)
    assert grpo([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]  # nothing to learn from a tied group
