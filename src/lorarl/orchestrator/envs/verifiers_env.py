"""verifiers tasksets as lorarl environments (`pip install 'lorarl[envs]'`), `id = "verifiers:<taskset>"`.

verifiers 0.4 (https://github.com/PrimeIntellect-ai/verifiers, `import verifiers.v1 as vf`) splits an
environment into a taskset (data: `TaskData` rows with a prompt and system prompt) and a `Task` whose
`@vf.reward` (weighted) and `@vf.metric` methods score a finished `vf.Trace`. lorarl takes both
halves and plays the episode itself: the prompt is rendered and sampled by lorarl's episode runner,
so the sampled token ids and vLLM logprobs are what the trainer gets, never re-tokenized text, and
the adapter version is lorarl's. The finished conversation becomes a `vf.Trace` (its model turn
marked sampled) that the task scores with its own `score`; each reward and metric is logged as
`env/<taskset>/<name>` and the reward is their weighted sum, as verifiers computes `trace.reward`.

`<taskset>` is what verifiers' own loaders take (an installed taskset package, e.g. `reverse-text`,
or one of verifiers' built-in tasksets), or a dotted module path importable from the folder `rl`
runs in (e.g. `examples.verifiers_env.reverse_words`), which verifiers' loaders do not accept. The
module exports its `Taskset` subclass in `__all__`; `args` are the taskset's config fields.

Only single-turn tasks run: verifiers 0.4 plays multi-turn and tool tasks through harness programs
(agent loops in sandboxes or subprocesses, reaching the model through verifiers' interception
server), which has no turn-by-turn hook that lorarl's token bookkeeping could drive. Tasksets with
tool servers, judges (which call a model) or containers are refused by `check`; the classic
`SingleTurnEnv`/`MultiTurnEnv` API is only in verifiers <= 0.3, whose `mcp<2` pin conflicts with
vLLM 0.32's `mcp>=2` (see pyproject's `envs` extra).
"""

from __future__ import annotations

import importlib
import logging
import random
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message

try:
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import content_text
    from verifiers.v1.utils.generic import concrete_type
except ModuleNotFoundError as e:  # an optional extra
    raise ModuleNotFoundError(f"verifiers environments need verifiers: pip install 'lorarl[envs]' ({e})") from e

PREFIX = "verifiers"
log = logging.getLogger("lorarl.orchestrator")
_ROLES: dict[str, type[Any]] = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}


def taskset_class(taskset_id: str) -> type[vf.Taskset]:
    """The `Taskset` subclass that the module `taskset_id` names exports in `__all__`."""
    module = _import(taskset_id)
    exported = [getattr(module, name, None) for name in getattr(module, "__all__", ())]
    found = [c for c in exported if isinstance(c, type) and issubclass(c, vf.Taskset) and c is not vf.Taskset]
    if len(found) != 1:
        raise TypeError(
            f"verifiers taskset module {module.__name__!r} must export exactly one Taskset subclass in __all__, "
            f"found {[c.__name__ for c in found]}"
        )
    return found[0]


def _import(taskset_id: str) -> ModuleType:
    if not taskset_id:
        raise ValueError(f"name the taskset: id = '{PREFIX}:<taskset package or module>'")
    if "." in taskset_id:  # a module path (verifiers' loaders take package names only)
        return importlib.import_module(taskset_id)
    return vf.import_taskset(taskset_id)


def taskset_config(taskset_id: str, args: dict[str, Any]) -> vf.TasksetConfig:
    """`args` validated as the taskset's config (its `TasksetConfig` subclass); one line on error."""
    cls = taskset_class(taskset_id)
    config_type = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    if "id" in args:
        raise ValueError("args.id: the taskset is the part of the id after 'verifiers:'")
    try:
        config = config_type.model_validate({**args, "id": taskset_id})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"args do not fit {config_type.__name__}: {problems}") from None
    check_single_turn(cls, config)
    return config


def check_single_turn(cls: type[vf.Taskset], config: vf.TasksetConfig) -> None:
    """What lorarl cannot play: tasks needing a container, tool servers, or judges (a model call)."""
    task_type = cls.task_type()
    needs = [
        what
        for what, present in (
            ("a container", task_type.NEEDS_CONTAINER),
            ("tool servers", cls.toolsets(config) or task_type.toolsets(config.task)),
            ("judges", config.task.judges),
        )
        if present
    ]
    if needs:
        raise ValueError(f"{cls.__name__} needs {' and '.join(needs)}; lorarl plays single-turn verifiers tasks only")


class VerifiersTaskset(Environment):
    """A verifiers taskset played single-turn; an example is {"task": the task's data as JSON}."""

    def __init__(self, taskset: vf.Taskset, name: str) -> None:
        self.name, self.taskset = name, taskset
        self.task_type = taskset.task_type()
        self.data_type = self.task_type.data_type()
        self.rewards = []  # the task scores itself: see `score`
        self._tasks: list[Example] | None = None

    def examples(self, rng: random.Random) -> Iterator[Example]:
        """A finite taskset in a fresh `rng` order each pass; an endless one in its own order."""
        if not self.taskset.bounded:
            while True:
                yield from ({"task": self.dump(task)} for task in self.taskset)
        if self._tasks is None:
            self._tasks = [{"task": self.dump(task)} for task in self.taskset]
            if not self._tasks:
                raise ValueError(f"verifiers taskset {self.name!r} has no tasks")
        while True:
            yield from rng.sample(self._tasks, len(self._tasks))

    @staticmethod
    def dump(task: vf.Task) -> dict[str, Any]:
        return task.data.model_dump(mode="json")

    def task(self, example: Example) -> vf.Task:
        return self.task_type(self.data_type.model_validate(example["task"]), self.taskset.config.task)

    def prompt(self, example: Example) -> list[Message]:
        """The task's system prompt, then its prompt (a string is one user message)."""
        data = self.data_type.model_validate(example["task"])
        system = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if data.prompt is None:
            raise ValueError(f"{self.name}: task {data.idx} has no prompt (a user-opened conversation)")
        if isinstance(data.prompt, str):
            return [*system, {"role": "user", "content": data.prompt}]
        return [*system, *({"role": m.role, "content": content_text(m.content)} for m in data.prompt)]

    def solution(self, example: Example) -> str:
        answer = example["task"].get("answer")
        if not isinstance(answer, str):
            raise NotImplementedError(f"{self.name}: its tasks have no string `answer` field")
        return answer

    async def score(self, episode: Episode) -> dict[str, float]:
        """The task's own rewards and metrics of the episode as a `vf.Trace`; "reward" is the rewards'
        weighted sum. A reward the task leaves unscored, or a scoring error, counts in
        "reward_errors" and scores 0."""
        task = self.task(episode.example)
        trace = self.trace(task, episode)
        failed = 0
        try:
            await task.score(trace)  # records every reward first as None (unscored), then its score
        except Exception:
            log.exception("verifiers task of %s failed to score; scoring 0", self.name)
            failed = 1
        metrics = {name: float(value) for name, value in trace.metrics.items() if value is not None}
        scores = metrics | {name: float(r.score) if r else 0.0 for name, r in trace.rewards.items()}
        scores["reward"] = sum(r.value for r in trace.rewards.values() if r)
        scores["reward_errors"] = max(failed, sum(r is None for r in trace.rewards.values()))
        return scores

    def trace(self, task: vf.Task, episode: Episode) -> vf.Trace:
        """The conversation as one branch; the assistant messages after the prompt are the model's."""
        n_prompt = len(self.prompt(episode.example))
        trace = vf.Trace(
            task=TraceTask(type=self.task_type.__name__, data=task.data), agent=AgentInfo(config=vf.AgentConfig())
        )
        for i, m in enumerate(episode.messages):
            sampled = i >= n_prompt and m["role"] == "assistant"
            message = _ROLES[m["role"]](content=m["content"])
            trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=message, sampled=sampled))
        return trace


def check(task: str | None, args: dict[str, Any]) -> None:
    taskset_config(task or "", args)


def load(task: str | None, args: dict[str, Any]) -> VerifiersTaskset:
    config = taskset_config(task or "", args)
    return VerifiersTaskset(taskset_class(config.id)(config), name=config.id.rsplit(".", 1)[-1])
