"""reasoning-gym's procedural tasks as lorarl environments (`pip install 'lorarl[envs]'`).

reasoning-gym (https://github.com/open-thought/reasoning-gym) generates questions with reference
answers and scores answers with each task's own scorer, without downloads. Two ids reach it:
`reasoning_gym:<task>` (one task) and `reasoning_gym` with a weighted mix of tasks in `args.tasks`.

The answer is what reasoning-gym's own evaluation reads: the text of the last
`<answer>...</answer>` of the completion, stripped (`reasoning_gym.utils.extract_answer`), scored
with `dataset.score_answer(answer, entry)`; a completion without the tag scores 0.

Examples come from the seeded stream lorarl hands `examples(rng)`, so runs are reproducible. A
reasoning-gym item is a function of its dataset's seed plus its index, so items are drawn in
blocks of `BLOCK` consecutive generator seeds: even blocks for training, odd ones for evals, which
keeps the two apart whatever orchestrator.seed and orchestrator.eval.seed are (a task with few
distinct questions may still ask the same question in both).
"""

from __future__ import annotations

import difflib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message, WeightedReward

try:
    import reasoning_gym
    from reasoning_gym.factory import DATASETS
    from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer
except ModuleNotFoundError as e:  # an optional extra
    raise ModuleNotFoundError(f"reasoning_gym environments need reasoning-gym: pip install 'lorarl[envs]' ({e})") from e

PREFIX = "reasoning_gym"
BLOCK = 500  # items per dataset (reasoning-gym's default size)
# Item seeds (dataset seed + index) stay below 2**32: some tasks seed numpy with them.
_BLOCKS = 2**32 // BLOCK - 1
_SET_BY_LORARL = {"seed", "size"}  # dataset fields the example stream owns
SINGLE_TASK_ARGS = {"config", "system_prompt"}
MIX_ARGS = {"tasks", "config", "system_prompt"}


@dataclass(frozen=True)
class TaskMix:
    """The checked args of a reasoning-gym environment: task weights, each task's dataset config,
    and the system prompt ("" for none)."""

    weights: dict[str, float]
    configs: dict[str, dict[str, Any]]
    system_prompt: str


def parse_args(task: str | None, args: dict[str, Any]) -> TaskMix:
    """`args` of `reasoning_gym:<task>` (task given) or of `reasoning_gym` (tasks in args), checked
    against reasoning-gym's registry and each task's own config validation; nothing is generated."""
    allowed = MIX_ARGS if task is None else SINGLE_TASK_ARGS
    if unknown := sorted(set(args) - allowed):
        raise TypeError(f"unexpected args {unknown}; {PREFIX if task is None else task} takes {sorted(allowed)}")
    if task is None:
        if "tasks" not in args:
            raise TypeError(f"{PREFIX} needs args.tasks, e.g. tasks = {{ leg_counting = 1.0, gcd = 2.0 }}")
        weights = task_weights(args["tasks"])
        configs = args.get("config", {})
        if not isinstance(configs, dict) or not all(isinstance(c, dict) for c in configs.values()):
            raise TypeError(f"config must map task names to config tables, got {configs!r}")
        if stray := sorted(set(configs) - set(weights)):
            raise ValueError(f"config for {stray}, which are not in tasks {sorted(weights)}")
    else:
        weights, configs = {task: 1.0}, {task: args.get("config", {})}
    system_prompt = args.get("system_prompt", SYSTEM_PROMPTS["default"])
    if not isinstance(system_prompt, str):
        raise TypeError(f"system_prompt must be a string, got {system_prompt!r}")
    for name in weights:
        check_task(name, configs.get(name, {}))
    return TaskMix(weights, {name: dict(configs.get(name, {})) for name in weights}, system_prompt)


def task_weights(tasks: Any) -> dict[str, float]:
    """`tasks` as {name: weight}: a list of names weighs them equally."""
    if isinstance(tasks, list) and all(isinstance(t, str) for t in tasks):
        tasks = dict.fromkeys(tasks, 1.0)
    if not isinstance(tasks, dict) or not tasks:
        raise TypeError(f"tasks must be a non-empty table of task = weight, or a list of task names, got {tasks!r}")
    for name, weight in tasks.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < math.inf:
            raise ValueError(f"task {name!r}: weight must be a positive number, got {weight!r}")
    return {name: float(weight) for name, weight in tasks.items()}


def check_task(task: str, config: Any) -> None:
    """`task` is in reasoning-gym's registry and `config` builds a valid config of it."""
    if task == "composite":
        raise ValueError(f"task 'composite': mix tasks with id = {PREFIX!r} and args.tasks instead")
    if task not in DATASETS:
        close = difflib.get_close_matches(task, DATASETS, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"{len(DATASETS)} in reasoning_gym.factory.DATASETS"
        raise ValueError(f"unknown reasoning-gym task {task!r} ({hint})")
    if not isinstance(config, dict):
        raise TypeError(f"task {task!r}: config must be a table, got {config!r}")
    config_class = DATASETS[task][1]
    known = {f.name for f in fields(config_class)} - _SET_BY_LORARL
    if owned := sorted(set(config) & _SET_BY_LORARL):
        raise ValueError(f"task {task!r}: {owned} are set by lorarl (examples follow orchestrator.seed)")
    if unknown := sorted(set(config) - known):
        raise TypeError(f"task {task!r}: config has no {unknown}; it takes {sorted(known)}")
    try:
        built = config_class(**config)
        if hasattr(built, "validate"):
            built.validate()
    except (AssertionError, ValueError, TypeError) as e:
        raise ValueError(f"task {task!r}: bad config {config}: {e}") from None


class ReasoningGym(Environment):
    """One reasoning-gym task or a weighted mix; an example is {"task": name, "entry": the
    reasoning-gym item (question, answer, metadata)}."""

    def __init__(self, mix: TaskMix, name: str = PREFIX) -> None:
        self.name, self.mix = name, mix
        # Scoring needs a dataset object; seeds do not change how a task scores.
        self.scorers = {task: self.dataset(task, seed=0, size=1) for task in mix.weights}
        self.rewards = [WeightedReward(self.task_score, 1.0), WeightedReward(self.answer_format, 0.0)]

    def dataset(self, task: str, seed: int, size: int) -> Any:
        return reasoning_gym.create_dataset(task, **self.mix.configs[task], seed=seed, size=size)

    def examples(self, rng: random.Random) -> Iterator[Example]:
        return self.stream(rng, parity=0)

    def eval_examples(self, rng: random.Random) -> Iterator[Example]:
        return self.stream(rng, parity=1)

    def stream(self, rng: random.Random, parity: int) -> Iterator[Example]:
        """Each example's task drawn by weight; each task's items from its own seed blocks."""
        tasks, weights = list(self.mix.weights), list(self.mix.weights.values())
        entries = {task: self.entries(task, random.Random(rng.random()), parity) for task in tasks}
        while True:
            task = rng.choices(tasks, weights)[0]
            yield {"task": task, "entry": next(entries[task])}

    def entries(self, task: str, rng: random.Random, parity: int) -> Iterator[dict[str, Any]]:
        while True:
            dataset = self.dataset(task, seed=(2 * rng.randrange(_BLOCKS // 2) + parity) * BLOCK, size=BLOCK)
            yield from (dataset[i] for i in range(BLOCK))

    def prompt(self, example: Example) -> list[Message]:
        system = [{"role": "system", "content": self.mix.system_prompt}] if self.mix.system_prompt else []
        return [*system, {"role": "user", "content": example["entry"]["question"]}]

    def solution(self, example: Example) -> str:
        answer = example["entry"]["answer"]
        if answer is None:  # e.g. puzzles with many solutions, which the scorer checks
            raise NotImplementedError(f"reasoning-gym task {example['task']!r} has no reference answers")
        return f"<answer>{answer}</answer>"

    def task_score(self, episode: Episode) -> float:
        """The task's own score of the extracted answer; no `<answer>` tag: 0."""
        answer = extract_answer(episode.completion)
        if answer is None:
            return 0.0
        example = episode.example
        return float(self.scorers[example["task"]].score_answer(answer, example["entry"]))

    def answer_format(self, episode: Episode) -> float:
        """1 if the completion has an `<answer>...</answer>` (logged only: weight 0)."""
        return float(extract_answer(episode.completion) is not None)


def check(task: str | None, args: dict[str, Any]) -> None:
    parse_args(task, args)


def load(task: str | None, args: dict[str, Any]) -> ReasoningGym:
    return ReasoningGym(parse_args(task, args), name=task or PREFIX)
