"""alphabet_sort (multi-turn): names arrive over several turns; after each, the model writes every
name so far, sorted by first or by last name (chosen per episode), marking this turn's new names.

One name per line, "First Last", new ones followed by ` // new name!`. Each turn is scored by the
line-level similarity (difflib ratio, 0..1) of the answer to the expected list; the reward is the
mean over the episode's turns, a turn the model never got to counting 0. First and last names are
each drawn without replacement, so both sort keys are unique within an episode and the order is
never ambiguous.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Iterator

from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message, WeightedReward

FIRST_NAMES = (
    "Ada Alan Bea Carl Dora Emil Fay Gus Hana Ivan Jade Kurt Lena Milo Nina Omar Pia Quinn Rosa Sam "
    "Tess Uma Vito Wren Xena Yuri Zoe Abel Cleo Dean Elsa Finn Gina Hugo Iris Joel Kira Leon Maya Noah"
).split()
LAST_NAMES = (
    "Abbott Baker Chen Diaz Evans Fox Gray Hill Ito Jones Khan Lopez Moore Nash Owens Park Quill Reed "
    "Silva Tate Ueda Vance Webb Xu Young Zhang Adler Brook Cruz Dunn Ellis Ford Grant Hayes Irwin Kemp"
).split()
NEW_MARK = " // new name!"


def expected_turns(sort_by: str, turns: list[list[str]]) -> list[str]:
    """The answer expected after each turn: the cumulative sorted list, this turn's names marked."""
    key_index = 0 if sort_by == "first" else 1
    answers, seen = [], []
    for names in turns:
        seen += names
        ordered = sorted(seen, key=lambda name: name.split()[key_index])
        answers.append("\n".join(name + NEW_MARK if name in names else name for name in ordered))
    return answers


def _lines(text: str) -> list[str]:
    # Blank lines and stray spaces carry no information about the order; ignore them.
    return [" ".join(line.split()) for line in text.strip().splitlines() if line.strip()]


def turn_similarity(episode: Episode) -> float:
    """Mean over the expected turns of the line-level similarity of each answer to its expectation."""
    expected = episode.example["expected"]
    turns = episode.turns
    return sum(
        difflib.SequenceMatcher(None, _lines(answer), _lines(want)).ratio()
        for answer, want in zip(turns, expected, strict=False)
    ) / len(expected)


def all_turns_exact(episode: Episode) -> float:
    """1 when every turn's list is exactly right (logged as a metric; weight 0)."""
    expected = episode.example["expected"]
    return float([_lines(a) for a in episode.turns[: len(expected)]] == [_lines(w) for w in expected])


class AlphabetSort(Environment):
    name = "alphabet_sort"
    rewards = [WeightedReward(turn_similarity), WeightedReward(all_turns_exact, 0.0)]

    def __init__(
        self, min_turns: int = 2, max_turns: int = 3, min_names_per_turn: int = 1, max_names_per_turn: int = 3
    ) -> None:
        if not 1 <= min_turns <= max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {min_turns}, {max_turns}")
        if not 1 <= min_names_per_turn <= max_names_per_turn:
            raise ValueError(
                f"need 1 <= min_names_per_turn <= max_names_per_turn, got {min_names_per_turn}, {max_names_per_turn}"
            )
        if max_turns * max_names_per_turn > min(len(FIRST_NAMES), len(LAST_NAMES)):
            raise ValueError(
                f"max_turns * max_names_per_turn = {max_turns * max_names_per_turn} exceeds the "
                f"{min(len(FIRST_NAMES), len(LAST_NAMES))} distinct names available"
            )
        self.min_turns, self.max_turns = min_turns, max_turns
        self.min_names, self.max_names = min_names_per_turn, max_names_per_turn

    def examples(self, rng: random.Random) -> Iterator[Example]:
        while True:
            sort_by = rng.choice(["first", "last"])
            counts = [
                rng.randint(self.min_names, self.max_names) for _ in range(rng.randint(self.min_turns, self.max_turns))
            ]
            total = sum(counts)
            names = [
                f"{f} {la}" for f, la in zip(rng.sample(FIRST_NAMES, total), rng.sample(LAST_NAMES, total), strict=True)
            ]
            turns = [names[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(counts))]
            yield {"sort_by": sort_by, "turns": turns, "expected": expected_turns(sort_by, turns)}

    def prompt(self, example: Example) -> list[Message]:
        system = (
            f"Names arrive over several turns. After each turn, list every name so far, one per line, sorted by "
            f"{example['sort_by'].upper()} name. Mark the names new this turn like this: Ada Chen{NEW_MARK}"
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(example["turns"][0])}]

    def solutions(self, example: Example) -> list[str]:
        return list(example["expected"])

    def env_response(self, episode: Episode) -> list[Message] | None:
        turns = episode.example["turns"]
        done = len(episode.turns)
        return [{"role": "user", "content": "\n".join(turns[done])}] if done < len(turns) else None
