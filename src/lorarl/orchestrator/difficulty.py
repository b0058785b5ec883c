"""Online difficulty filtering (`[orchestrator.difficulty_filter]`): a memory of each example's recent
pass rates, and draws that pass over the examples it says are too easy or too hard.

An example is known by its environment's name and its JSON (`example_key`). Each written batch adds
one attempt per group to the memory: (the step of the batch, the group's mean reward). A draw for
step N consults only attempts of batches up to N - 1 - max_async_level: the orchestrator may draw a
group for N once policy version N - 1 - max_async_level is out, which the trainer publishes only
after reading that batch, so those attempts are always in, whatever the timing, and a resumed run
draws the same examples. The memory is part of the orchestrator's checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter, OrderedDict
from typing import Any, Literal

from lorarl.config.orchestrator import DifficultyFilterConfig
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.groups import Group
from lorarl.orchestrator.sampler import ExampleSampler

MAX_SKIPS_IN_A_ROW = 1000  # then the next example is played anyway: the stream may hold nothing else

Verdict = Literal["easy", "hard"]


def example_key(env_name: str, example: Example) -> str:
    """A stable identity of an example: a hash of its environment's name and its JSON."""
    text = json.dumps([env_name, example], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


class DifficultyFilter:
    def __init__(self, cfg: DifficultyFilterConfig, max_async_level: int) -> None:
        self.cfg, self.max_async_level = cfg, max_async_level
        # example key -> its attempts [(step of the batch, pass rate)], oldest first; least recently
        # attempted example first, so that the one to forget is at the front.
        self.attempts: OrderedDict[str, list[tuple[int, float]]] = OrderedDict()
        self.skipped: Counter[str] = Counter()  # since the last `step_metrics`: "easy", "hard", "forced"

    def draw(self, sampler: ExampleSampler, step: int) -> tuple[Environment, Example]:
        """The sampler's next example for a group of `step` that is neither too easy nor too hard."""
        for _ in range(MAX_SKIPS_IN_A_ROW):
            env, example = sampler.draw()
            verdict = self.verdict(env.name, example, step)
            if verdict is None:
                return env, example
            self.skipped[verdict] += 1
        self.skipped["forced"] += 1
        return env, example

    def verdict(self, env_name: str, example: Example, step: int) -> Verdict | None:
        """Whether a group of `step` should skip this example, from its attempts up to batch
        step - 1 - max_async_level (module docstring): "easy", "hard", or None (play it)."""
        seen_through = step - 1 - self.max_async_level
        attempts = self.attempts.get(example_key(env_name, example), [])
        rates = [rate for s, rate in attempts if s <= seen_through][-self.cfg.window :]
        if len(rates) < self.cfg.window:
            return None
        if self.cfg.max_pass is not None and all(r >= self.cfg.max_pass for r in rates):
            return "easy"
        if self.cfg.min_pass is not None and all(r <= self.cfg.min_pass for r in rates):
            return "hard"
        return None

    def record(self, step: int, groups: list[Group]) -> None:
        """The groups of batch `step` (all of them, trained on or not) are attempts of their examples."""
        # Every later draw is for a step > `step`, so it reads the attempts of batches up to
        # `always_read` at least: of those, only the last `window` can still matter.
        always_read = step - self.max_async_level
        for group in groups:
            key = example_key(group.env.name, group.example)
            attempts = self.attempts.pop(key, [])
            attempts.append((step, statistics.fmean(score["reward"] for score in group.scores)))
            settled = [a for a in attempts if a[0] <= always_read][-self.cfg.window :]
            self.attempts[key] = settled + [a for a in attempts if a[0] > always_read]
        while len(self.attempts) > self.cfg.capacity:
            self.attempts.popitem(last=False)

    def step_metrics(self) -> dict[str, float]:
        """What was skipped since the last call, and how many examples are remembered."""
        out: dict[str, float] = {f"difficulty/skipped_{kind}": self.skipped[kind] for kind in ("easy", "hard")}
        out["difficulty/forced"] = self.skipped["forced"]
        out["difficulty/remembered"] = len(self.attempts)
        self.skipped.clear()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"attempts": [[key, attempts] for key, attempts in self.attempts.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.attempts = OrderedDict((key, [(int(s), float(r)) for s, r in a]) for key, a in state["attempts"])
