"""unscramble: put the shuffled steps of a short procedure back in order.

The prompt shows a procedure's title and a contiguous run of its steps, shuffled and numbered in
the order shown; the answer is those numbers in the order the steps are done (e.g. "3 1 2"). Each
step of a procedure needs the one before it, so the order is well-defined. An answer is read as the
integers it contains and must be a permutation of the shown numbers (anything else scores 0).
`reward_mode`: "binary" is 1 only for the right order; "partial" is the longest run of steps in the
right relative order (longest common subsequence with the true order) divided by the number of steps.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message, WeightedReward

PROCEDURES: dict[str, tuple[str, ...]] = {
    "Make tea": (
        "Fill the kettle.",
        "Switch the kettle on.",
        "Wait for the water to boil.",
        "Pour the water over the tea bag.",
        "Let the tea steep.",
        "Take out the tea bag.",
    ),
    "Plant a seed": (
        "Dig a small hole.",
        "Drop the seed in the hole.",
        "Cover the seed with soil.",
        "Water the soil.",
        "Wait for a sprout.",
        "Move the sprout to a big pot.",
    ),
    "Send a letter": (
        "Write the letter.",
        "Fold the letter.",
        "Put it in an envelope.",
        "Seal the envelope.",
        "Stamp the sealed envelope.",
        "Post the stamped envelope.",
    ),
    "Bake bread": (
        "Mix flour, water and yeast.",
        "Knead the dough.",
        "Let the dough rise.",
        "Shape the risen dough.",
        "Bake the loaf.",
        "Let the baked loaf cool.",
    ),
    "Make popcorn": (
        "Pour oil in a pot.",
        "Heat the oil.",
        "Add the corn kernels.",
        "Put the lid on the pot.",
        "Shake until the popping stops.",
        "Salt the popcorn.",
    ),
    "Wash clothes": (
        "Sort the clothes by color.",
        "Load one pile in the washer.",
        "Start the washer.",
        "Take out the wet clothes.",
        "Hang the clothes to dry.",
        "Fold the dry clothes.",
    ),
    "Boil an egg": (
        "Fill a pot with water.",
        "Bring the water to a boil.",
        "Lower the egg in.",
        "Cook it for eight minutes.",
        "Cool the egg in cold water.",
        "Peel the cooled egg.",
    ),
    "Paint a wall": (
        "Open the paint can.",
        "Stir the paint.",
        "Pour the paint into a tray.",
        "Dip the roller in the tray.",
        "Roll paint onto the wall.",
        "Let the wall dry.",
    ),
    "Brush teeth": (
        "Wet the toothbrush.",
        "Add toothpaste to the brush.",
        "Brush for two minutes.",
        "Spit out the toothpaste.",
        "Rinse your mouth.",
        "Rinse the brush.",
    ),
    "Make a sandwich": (
        "Take two slices of bread.",
        "Butter both slices.",
        "Lay cheese on one slice.",
        "Add lettuce on the cheese.",
        "Close it with the other slice.",
        "Cut the sandwich in half.",
    ),
    "Build a campfire": (
        "Clear a spot on the ground.",
        "Ring the spot with stones.",
        "Pile twigs in the ring.",
        "Light the twigs.",
        "Add logs to the flames.",
        "Put out the fire with water.",
    ),
    "Cook pasta": (
        "Fill a pot with salted water.",
        "Boil the water.",
        "Add the pasta.",
        "Cook it for ten minutes.",
        "Drain the cooked pasta.",
        "Mix the pasta with sauce.",
    ),
    "Wrap a gift": (
        "Put the gift in a box.",
        "Close the box.",
        "Set the box on the paper.",
        "Fold the paper over the box.",
        "Tape the paper down.",
        "Tie a ribbon around it.",
    ),
    "Make pancakes": (
        "Crack eggs into a bowl.",
        "Whisk in milk and flour.",
        "Pour batter in a hot pan.",
        "Wait for bubbles to form.",
        "Flip the pancake.",
        "Serve the cooked pancake.",
    ),
    "Fix a bike puncture": (
        "Take off the wheel.",
        "Pull the tube out.",
        "Find the hole in the tube.",
        "Glue a patch on the hole.",
        "Put the tube back in.",
        "Pump up the tire.",
    ),
    "Withdraw cash": (
        "Walk to the cash machine.",
        "Insert your card.",
        "Type your PIN.",
        "Choose the amount.",
        "Take the cash.",
        "Put the cash in your wallet.",
    ),
    "Write an essay": (
        "Pick a topic.",
        "Research the topic.",
        "Outline from your notes.",
        "Draft from the outline.",
        "Revise the draft.",
        "Hand in the essay.",
    ),
    "Move house": (
        "Pack your things in boxes.",
        "Load the boxes in a truck.",
        "Drive to the new home.",
        "Unload the boxes.",
        "Unpack the boxes.",
        "Recycle the empty boxes.",
    ),
    "Catch a train": (
        "Walk to the station.",
        "Buy a ticket at the counter.",
        "Go to the platform.",
        "Board the train.",
        "Ride to your stop.",
        "Get off the train.",
    ),
    "Frame a picture": (
        "Open the back of the frame.",
        "Take out the backing.",
        "Lay the picture on the glass.",
        "Put the backing back.",
        "Close the frame.",
        "Hang the frame.",
    ),
}
STEPS_PER_PROCEDURE = 6

SYSTEM_PROMPT = "The steps are shuffled. Write their numbers in the order the steps are done, e.g. 3 1 2."


def parse_order(text: str, n: int) -> list[int] | None:
    """The integers in the answer, if they are a permutation of 1..n."""
    numbers = [int(x) for x in re.findall(r"\d+", text)]
    return numbers if sorted(numbers) == list(range(1, n + 1)) else None


def ordered_run(answer: list[int], order: list[int]) -> int:
    """Length of the longest common subsequence of two permutations (the longest increasing run
    of the answer's steps' true positions)."""
    positions = [order.index(x) for x in answer]
    best: list[int] = []
    for i, p in enumerate(positions):
        best.append(1 + max((best[j] for j in range(i) if positions[j] < p), default=0))
    return max(best)


def in_order(episode: Episode) -> float:
    order = episode.example["order"]
    return float(parse_order(episode.completion, len(order)) == order)


def ordered_fraction(episode: Episode) -> float:
    order = episode.example["order"]
    answer = parse_order(episode.completion, len(order))
    return ordered_run(answer, order) / len(order) if answer else 0.0


class Unscramble(Environment):
    name = "unscramble"

    def __init__(self, reward_mode: str = "partial", min_steps: int = 3, max_steps: int = STEPS_PER_PROCEDURE) -> None:
        if reward_mode not in ("binary", "partial"):
            raise ValueError(f"reward_mode must be 'binary' or 'partial', got {reward_mode!r}")
        if not 2 <= min_steps <= max_steps <= STEPS_PER_PROCEDURE:
            raise ValueError(f"need 2 <= min_steps <= max_steps <= {STEPS_PER_PROCEDURE}, got {min_steps}, {max_steps}")
        self.min_steps, self.max_steps = min_steps, max_steps
        self.rewards = [WeightedReward(in_order if reward_mode == "binary" else ordered_fraction)]

    def examples(self, rng: random.Random) -> Iterator[Example]:
        titles = sorted(PROCEDURES)
        while True:
            title = rng.choice(titles)
            n = rng.randint(self.min_steps, self.max_steps)
            start = rng.randint(0, STEPS_PER_PROCEDURE - n)
            shown = list(range(n))  # shown[i]: the true position of the step displayed as number i + 1
            while shown == sorted(shown):  # an unshuffled list would give the answer away
                rng.shuffle(shown)
            steps = [PROCEDURES[title][start + i] for i in shown]
            yield {"title": title, "steps": steps, "order": [shown.index(i) + 1 for i in range(n)]}

    def prompt(self, example: Example) -> list[Message]:
        lines = [example["title"], *(f"{i}. {step}" for i, step in enumerate(example["steps"], 1))]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]

    def solution(self, example: Example) -> str:
        return " ".join(map(str, example["order"]))
