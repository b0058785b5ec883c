import asyncio
import random

import pytest

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Episode
from lorarl.orchestrator.envs.unscramble import PROCEDURES, STEPS_PER_PROCEDURE, Unscramble, ordered_run

# Shown as 1. Boil the water, 2. Fill a pot..., 3. Add the pasta: the right order is 2 1 3.
EXAMPLE = {
    "title": "Cook pasta",
    "steps": ["Boil the water.", "Fill a pot with salted water.", "Add the pasta."],
    "order": [2, 1, 3],
}


def score(env: Unscramble, completion: str, example: dict = EXAMPLE) -> float:
    messages = [*env.prompt(example), {"role": "assistant", "content": completion}]
    return asyncio.run(env.score(Episode(example, messages)))["reward"]


def test_prompt_shows_the_title_and_the_numbered_shuffled_steps() -> None:
    assert Unscramble().prompt(EXAMPLE)[-1]["content"] == (
        "Cook pasta\n1. Boil the water.\n2. Fill a pot with salted water.\n3. Add the pasta."
    )


@pytest.mark.parametrize("mode", ["binary", "partial"])
def test_right_answers_in_any_reasonable_format_score_one(mode: str) -> None:
    env = Unscramble(reward_mode=mode)
    for answer in ("2 1 3", "2, 1, 3", " 2\n1\n3\n", "The order is 2, 1, 3.", Unscramble().solution(EXAMPLE)):
        assert score(env, answer) == 1.0, answer


def test_wrong_order_is_zero_when_binary_and_partial_credit_when_partial() -> None:
    binary, partial = Unscramble(reward_mode="binary"), Unscramble(reward_mode="partial")
    assert score(binary, "1 2 3") == 0.0
    assert score(partial, "1 2 3") == pytest.approx(2 / 3)  # 1 3 (or 2 3) in the right relative order
    assert score(partial, "3 1 2") == pytest.approx(1 / 3)


@pytest.mark.parametrize("mode", ["binary", "partial"])
def test_malformed_answers_score_zero(mode: str) -> None:
    env = Unscramble(reward_mode=mode)
    for answer in ("", "2 1", "2 1 3 4", "2 1 1", "2 1 0 3", "two one three", "<|im_end|>"):
        assert score(env, answer) == 0.0, answer


def test_ordered_run_is_the_longest_common_subsequence() -> None:
    order = [3, 1, 4, 2, 5]
    assert ordered_run(order, order) == 5
    assert ordered_run([5, 2, 4, 1, 3], order) == 1
    assert ordered_run([1, 3, 4, 2, 5], order) == 4


def test_examples_are_reproducible_shuffled_and_solved_by_solution() -> None:
    env = load_environment("unscramble", {"min_steps": 3, "max_steps": 5, "reward_mode": "binary"})
    assert [next(env.examples(random.Random(5))) for _ in range(3)] == [
        next(env.examples(random.Random(5))) for _ in range(3)
    ]
    examples = env.examples(random.Random(0))
    for _ in range(200):
        ex = next(examples)
        n = len(ex["steps"])
        assert 3 <= n <= 5 and ex["order"] != list(range(1, n + 1))  # never shown already in order
        in_order = [ex["steps"][i - 1] for i in ex["order"]]
        procedure = PROCEDURES[ex["title"]]
        start = procedure.index(in_order[0])
        assert list(procedure[start : start + n]) == in_order  # a contiguous run, restored
        assert score(env, env.solution(ex), ex) == 1.0
    assert all(len(steps) == STEPS_PER_PROCEDURE for steps in PROCEDURES.values())


@pytest.mark.parametrize(
    "args, match",
    [
        ({"reward_mode": "lcs"}, "reward_mode"),
        ({"min_steps": 1}, "min_steps"),
        ({"min_steps": 4, "max_steps": 3}, "min_steps"),
        ({"max_steps": STEPS_PER_PROCEDURE + 1}, "max_steps"),
    ],
)
def test_bad_args_are_clear_errors(args: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Unscramble(**args)
