import asyncio
import random
from fractions import Fraction

import pytest

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Episode
from lorarl.orchestrator.envs.math_problems import KINDS, MathProblems, extract_answer, parse_number


def score(completion: str, answer: str) -> float:
    env, example = MathProblems(), {"question": "?", "answer": answer}
    messages = [*env.prompt(example), {"role": "assistant", "content": completion}]
    return asyncio.run(env.score(Episode(example, messages)))["reward"]


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("<answer>19</answer>", "19"),
        ("12 + 7 = 19, so <answer> 19 </answer>", "19"),
        ("<answer>1,234</answer>", "1234"),
        ("<answer>-3</answer>", "-3"),
        ("<answer>- 3</answer>", "-3"),
        ("<answer>\u22123</answer>", "-3"),
        ("<answer>4.20</answer>", "4.2"),
        ("<answer>3/4</answer>", "3/4"),
        ("<answer>6/8</answer>", "3/4"),
        ("<answer>0.75</answer>", "3/4"),
        ("<answer>1.5</answer>", "3/2"),
        ("The answer is $\\boxed{\\frac{3}{4}}$.", "3/4"),
        ("\\boxed{-12}", "-12"),
        ("<answer>$5.</answer>", "5"),
        ("<answer>0.3333333</answer>", "1/3"),  # within the relative tolerance
        ("first <answer>7</answer>, then I fixed it: <answer>8</answer>", "8"),  # the last answer counts
    ],
)
def test_right_answers_score_one(completion: str, answer: str) -> None:
    assert score(completion, answer) == 1.0


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("<answer>18</answer>", "19"),
        ("<answer>3</answer>", "-3"),
        ("<answer>0.33</answer>", "1/3"),
        ("<answer>8</answer> ... <answer>7</answer>", "8"),
    ],
)
def test_wrong_answers_score_zero(completion: str, answer: str) -> None:
    assert score(completion, answer) == 0.0


@pytest.mark.parametrize(
    "completion",
    ["19", "", "<answer></answer>", "<answer>19", "<answer>nineteen</answer>", "<answer>19 apples</answer>",
     "<answer>1 9</answer>", "<answer>19/0</answer>", "<answer>1.9e1</answer>", "<answer>1,9</answer>",
     "\\boxed{19", "<|im_end|>"],
)  # fmt: skip
def test_malformed_answers_score_zero(completion: str) -> None:
    assert score(completion, "19") == 0.0


def test_extract_and_parse() -> None:
    assert extract_answer("\\boxed{\\frac{1}{2}} and later <answer>3</answer>") == "3"
    assert extract_answer("<answer>3</answer> then \\boxed{\\dfrac{1}{2}}") == "\\dfrac{1}{2}"
    assert parse_number("-12,345.5") == Fraction(-24691, 2)
    assert parse_number("abc") is None and parse_number("1e3") is None and parse_number("nan") is None


def test_examples_are_reproducible_cover_every_kind_and_are_solved_by_solution() -> None:
    env = load_environment("math", {"max_value": 12})
    assert [next(env.examples(random.Random(1))) for _ in range(5)] == [
        next(env.examples(random.Random(1))) for _ in range(5)
    ]
    examples = env.examples(random.Random(0))
    for _ in range(500):
        ex = next(examples)
        assert score(env.solution(ex), ex["answer"]) == 1.0, ex
        assert parse_number(ex["answer"]) is not None
    negatives = [ex for ex in (next(examples) for _ in range(500)) if ex["answer"].startswith("-")]
    assert negatives  # sub and word problems reach below zero


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_alone(kind: str) -> None:
    env = MathProblems(kinds=[kind], max_value=5)
    for ex in (next(env.examples(random.Random(i))) for i in range(50)):
        assert score(env.solution(ex), ex["answer"]) == 1.0, ex


@pytest.mark.parametrize("args, match", [({"kinds": ["calculus"]}, "kinds"), ({"kinds": []}, "kinds"),
                                         ({"max_value": 1}, "max_value")])  # fmt: skip
def test_bad_args_are_clear_errors(args: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MathProblems(**args)
