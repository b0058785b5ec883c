"""calculator (multi-turn, tool calling): multi-digit arithmetic that a model gets right by calling a tool.

Each example is an expression of three to four-digit numbers (`4821 * 97 - 3310`), past what a
small model computes reliably in its head; the `calculate` tool evaluates arithmetic exactly. A turn
without tool calls ends the episode and is the answer, in `<answer>...</answer>` (read as in `math`).
Reward: 1 if it equals the true value, else 0; `used_tools` (weight 0) logs whether it called the
tool well-formed. The tool evaluates only numbers, + - * / // % ** and parentheses, through
Python's `ast` (never `eval`), with bounds on length and powers; anything else raises, which the
model is told (and env/calculator/tool_failed counts). Warm-up data (`solutions`) is the whole
correct episode: one call with the expression as given, then its result as the answer.
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

from lorarl.orchestrator.envs.base import Episode, Example, Message, WeightedReward
from lorarl.orchestrator.envs.math_problems import extract_answer, parse_number
from lorarl.orchestrator.envs.tool_env import ToolEnvironment, used_tools
from lorarl.orchestrator.tools import format_tool_call

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "(12 + 7) * 3 / 4".

    Args:
        expression: Numbers, + - * / // % ** and parentheses.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator} = {float(value):g}"
    )


def _evaluate(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(repr(node.value))  # 0.1 is 1/10, not the float nearest to it
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return Fraction(OPERATORS[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise ValueError(f"exponents must be whole numbers of at most {MAX_EXPONENT}")
        return Fraction(OPERATORS[type(node.op)](left, right))
    raise ValueError(f"unsupported in an arithmetic expression: {ast.unparse(node)!r}")


def correct(episode: Episode) -> float:
    answer = extract_answer(episode.completion)
    got = parse_number(answer) if answer is not None else None
    return float(got == Fraction(episode.example["answer"]))


class Calculator(ToolEnvironment):
    name = "calculator"
    rewards = [WeightedReward(correct), WeightedReward(used_tools, 0.0)]
    tools = [calculate]

    def __init__(self, max_turns: int = 3, terms: int = 3, max_value: int = 9999) -> None:
        if max_turns < 2:
            raise ValueError(f"max_turns must be >= 2 (at least one calculation and one answer), got {max_turns}")
        if terms < 2:
            raise ValueError(f"terms must be >= 2, got {terms}")
        if max_value < 100:
            raise ValueError(f"max_value must be >= 100, got {max_value}")
        self.max_turns, self.terms, self.max_value = max_turns, terms, max_value

    def examples(self, rng: random.Random) -> Iterator[Example]:
        while True:
            parts = [str(rng.randint(10, self.max_value))]
            for _ in range(self.terms - 1):
                parts += [rng.choice("+-*"), str(rng.randint(10, self.max_value))]
            expression = " ".join(parts)
            yield {"expression": expression, "answer": calculate(expression)}

    def solutions(self, example: Example) -> list[str]:
        """A correct episode, for warm-up data: calculate the expression as given, then answer its result."""
        call = format_tool_call("calculate", {"expression": example["expression"]})
        return [call, f"<answer>{example['answer']}</answer>"]

    def prompt(self, example: Example) -> list[Message]:
        system = "Use the calculate tool to compute exactly. Reply with the result as <answer>...</answer>."
        return [{"role": "system", "content": system}, {"role": "user", "content": f"{example['expression']} = ?"}]
