"""A worked example of your own environment: count a letter in a word, with another try if wrong.

It shows every part of the API: examples drawn with the given rng, the opening prompt, an
`env_response` that makes the task multi-turn (a wrong answer gets "try again", a right one ends
the episode), weighted reward functions of the finished episode, a reference `solution` for
supervised warm-up data, and arguments from the config checked in `__init__`.

From the repository root: `.venv/bin/rl @ examples/custom_environment/rl.toml` (see README.md).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

from lorarl import Environment, Episode, Example, Message, WeightedReward

WORDS = "banana strawberry mississippi committee bookkeeper balloon coffee parallel success letter".split()


def parse_count(text: str) -> int | None:
    """The answer must be a bare number (a final period allowed)."""
    match = re.fullmatch(r"\s*(\d+)\.?\s*", text)
    return int(match.group(1)) if match else None


def correct_count(episode: Episode) -> float:
    """1 if right on the first try, 1/2 on the second, ...; 0 if the last answer is wrong."""
    turns = episode.turns
    return float(parse_count(turns[-1]) == episode.example["count"]) / len(turns)


def answered_a_number(episode: Episode) -> float:
    """A small bonus for the format alone, so an untrained model gets a signal early."""
    return float(all(parse_count(turn) is not None for turn in episode.turns))


class CountLetter(Environment):
    name = "count_letter"
    rewards = [WeightedReward(correct_count), WeightedReward(answered_a_number, 0.1)]

    def __init__(self, max_attempts: int = 2, words: list[str] | None = None) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.words = list(WORDS if words is None else words)
        if not self.words or not all(w.isalpha() for w in self.words):
            raise ValueError("words must be a non-empty list of alphabetic words")
        self.max_turns = max_attempts  # the orchestrator plays at most this many model turns

    def examples(self, rng: random.Random) -> Iterator[Example]:
        while True:  # endless; all randomness from `rng`, so a seed reproduces the stream
            word = rng.choice(self.words)
            letter = rng.choice(sorted(set(word)))
            yield {"word": word, "letter": letter, "count": word.count(letter)}

    def prompt(self, example: Example) -> list[Message]:
        question = f"How many times does the letter '{example['letter']}' appear in '{example['word']}'?"
        return [{"role": "system", "content": "Answer with a number only."}, {"role": "user", "content": question}]

    def env_response(self, episode: Episode) -> list[Message] | None:
        if parse_count(episode.completion) == episode.example["count"]:
            return None  # right: the episode ends
        return [{"role": "user", "content": "That is not right. Try again."}]

    def solution(self, example: Example) -> str:
        return str(example["count"])


def make_env(**args: Any) -> CountLetter:
    """The factory the config names, declared one by its return annotation (an Environment):
    `[[orchestrator.env]] args` arrive as keyword arguments."""
    return CountLetter(**args)
