"""reverse_text: the model must write a given text backwards, character by character.

Partial credit: the reward is the similarity (difflib ratio, 0..1) between the answer and the true
reversal, so a policy that gets most characters right is rewarded more than one that gets few.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Iterator

from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message, WeightedReward

WORDS = (
    "apple river stone cloud light green music paper table water bread chair dream earth field "
    "glass honey island jelly kite lemon money night ocean piano queen robot sugar tiger umbrella "
    "violin window yellow zebra candle forest garden hammer ladder mirror pencil rocket silver "
    "tunnel valley wallet basket copper dragon engine feather guitar harbor insect jacket kitten"
).split()

SYSTEM_PROMPT = "Reverse the text."


def reversal_similarity(episode: Episode) -> float:
    return difflib.SequenceMatcher(None, episode.completion.strip(), episode.example["text"][::-1]).ratio()


class ReverseText(Environment):
    name = "reverse_text"
    rewards = [WeightedReward(reversal_similarity)]

    def __init__(self, min_words: int = 1, max_words: int = 2, words: list[str] | None = None) -> None:
        if not 1 <= min_words <= max_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
        self.min_words, self.max_words = min_words, max_words
        self.words = list(words or WORDS)

    def examples(self, rng: random.Random) -> Iterator[Example]:
        while True:
            n = rng.randint(self.min_words, self.max_words)
            yield {"text": " ".join(rng.choice(self.words) for _ in range(n))}

    def prompt(self, example: Example) -> list[Message]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": example["text"]}]

    def solution(self, example: Example) -> str:
        return example["text"][::-1]
