"""math: arithmetic and short word problems with one numeric answer.

The answer is read from the last `<answer>...</answer>` or `\\boxed{...}` of the completion and
compared numerically (relative tolerance 1e-6) with the true answer: reward 1 if equal, else 0;
no tag, or a tag that does not hold a single number, scores 0. Accepted forms: integers, negative
numbers, decimals, fractions `a/b` or `\\frac{a}{b}`, thousands separators `1,234`, `$` signs.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from fractions import Fraction

from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message, WeightedReward

KINDS = ("add", "sub", "mul", "div", "fraction", "decimal", "word")
SYSTEM_PROMPT = "Solve the problem. End with the final answer as <answer>...</answer>; write fractions as a/b."
TOLERANCE = 1e-6
_NUMBER = re.compile(r"[+-]?(\d+/\d+|\d+\.?\d*|\.\d+)")


def extract_answer(text: str) -> str | None:
    """The content of the last `<answer>` tag or `\\boxed{}` (braces inside it balanced), if any."""
    found = [(m.start(), m.group(1)) for m in re.finditer(r"<answer>(.*?)</answer>", text, re.DOTALL)]
    for m in re.finditer(r"\\boxed\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append((m.start(), text[m.end() : i - 1]))
    return max(found)[1] if found else None


def parse_number(text: str) -> Fraction | None:
    """A number written the ways people and models write one, or None."""
    s = text.strip().strip("$").replace("\u2212", "-")
    s = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"\1/\2", s)
    s = " ".join(s.split()).rstrip(".")  # a sentence-final period is not part of the number
    s = re.sub(r"\s*/\s*", "/", re.sub(r"^([+-])\s+", r"\1", s))
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if not _NUMBER.fullmatch(s):
        return None
    try:
        return Fraction(s)
    except ZeroDivisionError:
        return None


def format_number(x: Fraction, decimal: bool = False) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.1f}" if decimal else f"{x.numerator}/{x.denominator}"


def correct_answer(episode: Episode) -> float:
    answer = extract_answer(episode.completion)
    got = parse_number(answer) if answer is not None else None
    want = Fraction(episode.example["answer"])
    return float(got is not None and abs(got - want) <= TOLERANCE * max(Fraction(1), abs(want)))


def make_problem(kind: str, rng: random.Random, m: int) -> tuple[str, str]:
    """A question of this kind with operands up to `m`, and its answer as a string."""
    a, b = rng.randint(0, m), rng.randint(2, m)  # b >= 2: it is also a divisor and a group count
    if kind == "add":
        return f"What is {a} + {b}?", str(a + b)
    if kind == "sub":
        return f"What is {a} - {b}?", str(a - b)
    if kind == "mul":
        return f"What is {a} * {b}?", str(a * b)
    if kind == "div":
        return f"What is {a * b} / {b}?", str(a)
    if kind == "fraction":
        q, s = rng.randint(2, min(m, 9)), rng.randint(2, min(m, 9))
        p, r = rng.randint(1, q - 1), rng.randint(1, s - 1)
        return f"What is {p}/{q} + {r}/{s}?", format_number(Fraction(p, q) + Fraction(r, s))
    if kind == "decimal":
        x, y = Fraction(rng.randint(1, 10 * m), 10), Fraction(rng.randint(1, 10 * m), 10)
        return f"What is {float(x)} + {float(y)}?", format_number(x + y, decimal=True)
    stories = [
        (f"A bowl has {a} apples and {b} more are added. How many apples are in the bowl?", a + b),
        (f"Mia has {a + b} coins and spends {b}. How many coins does she have left?", a),
        (f"A box holds {a} pens. How many pens are in {b} boxes?", a * b),
        (f"{a * b} cookies are shared equally by {b} kids. How many cookies does each kid get?", a),
        (f"It is {a} degrees and it gets {a + b} degrees colder. What is the temperature now?", -b),
    ]
    question, answer = rng.choice(stories)
    return question, str(answer)


class MathProblems(Environment):
    name = "math"
    rewards = [WeightedReward(correct_answer)]

    def __init__(self, kinds: list[str] | None = None, max_value: int = 20) -> None:
        self.kinds = list(KINDS if kinds is None else kinds)
        if not self.kinds or not set(self.kinds) <= set(KINDS):
            raise ValueError(f"kinds must be a non-empty list from {list(KINDS)}, got {kinds}")
        if max_value < 2:
            raise ValueError(f"max_value must be >= 2, got {max_value}")
        self.max_value = max_value

    def examples(self, rng: random.Random) -> Iterator[Example]:
        while True:
            question, answer = make_problem(rng.choice(self.kinds), rng, self.max_value)
            yield {"question": question, "answer": answer}

    def prompt(self, example: Example) -> list[Message]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": example["question"]}]

    def solution(self, example: Example) -> str:
        return f"<answer>{example['answer']}</answer>"
