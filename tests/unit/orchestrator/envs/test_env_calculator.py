import asyncio
import random
from itertools import islice

import pytest

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.calculator import Calculator, calculate
from tests.unit.orchestrator.envs.env_play import play_and_score, play_by_hand


def calc(expression: str) -> str:
    return f'<tool_call>\n{{"name": "calculate", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


def test_calculate_is_exact_arithmetic() -> None:
    assert calculate("4821 * 97 - 3310") == str(4821 * 97 - 3310)
    assert calculate("(12 + 7) * 3 / 4") == "57/4 = 14.25"
    assert calculate("-2 ** 10 // 3 % 7") == str(-(2**10) // 3 % 7)
    assert calculate("0.1 + 0.2") == "3/10 = 0.3"  # exact, no float rounding


@pytest.mark.parametrize(
    "expression, error",
    [
        ("__import__('os').system('ls')", "unsupported"),
        ("x + 1", "unsupported"),
        ("2 ** 1000", "exponents"),
        ("2 ** 0.5", "exponents"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 300, "longer than"),
    ],
)
def test_anything_but_arithmetic_raises(expression: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        calculate(expression)
    with pytest.raises(ZeroDivisionError):
        calculate("1 / (2 - 2)")


def test_an_episode_with_the_tool_scores_and_counts_its_calls() -> None:
    env = Calculator()
    example = {"expression": "4821 * 97 - 3310", "answer": calculate("4821 * 97 - 3310")}
    episode = play_by_hand(env, example, [calc("4821 * 97 - 3310") + calc("1 / 0"), "<answer>464327</answer>"])
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == [
        "464327",
        "Error: calculate raised ZeroDivisionError: Fraction(1, 0)",
    ]
    scores = asyncio.run(env.score(episode))
    assert scores["correct"] == 1.0 and scores["used_tools"] == 1.0
    assert scores["tool_calls"] == 2.0 and scores["tool_failed"] == 1.0
    wrong = asyncio.run(env.score(play_by_hand(env, example, ["<answer>464328</answer>"])))
    assert wrong["correct"] == 0.0 and wrong["used_tools"] == 0.0 and wrong["tool_calls"] == 0.0


def test_examples_are_reproducible_and_answer_themselves() -> None:
    env = load_environment("calculator", {"terms": 4, "max_value": 500})
    first = [e for e, _ in zip(env.examples(random.Random(3)), range(5), strict=False)]
    assert first == [e for e, _ in zip(env.examples(random.Random(3)), range(5), strict=False)]
    for ex in first:
        assert len(ex["expression"].split()) == 7 and ex["answer"] == calculate(ex["expression"])


@pytest.mark.parametrize("args", [{}, {"terms": 2, "max_value": 999}, {"max_turns": 2, "terms": 4}])
def test_reference_episodes_calculate_the_expression_and_score_one(args: dict) -> None:
    env = Calculator(**args)
    for example in islice(env.examples(random.Random(0)), 20):
        turns = env.solutions(example)
        assert turns == [calc(example["expression"]), f"<answer>{example['answer']}</answer>"]
        episode, scores = play_and_score(env, example, turns)
        assert [m["content"] for m in episode.messages if m["role"] == "tool"] == [example["answer"]]
        assert scores["correct"] == 1.0 and scores["used_tools"] == 1.0 and scores["tool_failed"] == 0.0


@pytest.mark.parametrize("args", [{"max_turns": 1}, {"terms": 1}, {"max_value": 10}])
def test_bad_args_are_clear_errors(args: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(args))):
        Calculator(**args)
