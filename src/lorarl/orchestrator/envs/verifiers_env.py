"""verifiers tasksets as lorarl environments (`pip install 'lorarl[envs]'`), `id = "verifiers:<taskset>"`.

verifiers 0.4 (https://github.com/PrimeIntellect-ai/verifiers, `import verifiers.v1 as vf`) splits an
environment into a taskset (data: `TaskData` rows with a prompt and system prompt), a `Task` whose
`@vf.reward` (weighted) and `@vf.metric` methods score a finished `vf.Trace`, its tool servers
(`vf.Toolset`s of `@vf.tool` methods), and for multi-turn tasks an `Env` whose `run` answers the
model turn by turn. verifiers drives the model through harness programs (its chat loop, agent CLIs)
that reach it through its interception server; for training, its `TrainClient` renders each request
again and calls vLLM's `/inference/v1/generate`, and the trainer reads `trace.branches`. lorarl keeps
the parts that define the task and plays the episode itself: the prompt is rendered and sampled by
lorarl's episode runner with lorarl's adapter version, so the sampled token ids and vLLM logprobs are
what the trainer gets, and where the chat template re-renders history the episode goes on in a new
sample (`split_frac`), as for every lorarl environment. In place of the harness: the task's tools
are called in-process (verifiers_tools.py), and the `Env`'s `run` is handed a seat whose turns are
the runner's model turns (verifiers_protocol.py). No subprocess, interception server or second
tokenization of the conversation is needed, and the harness programs could not run here anyway
(verifiers' chat loop is a `uv` script that installs its packages when it starts). The episode is
kept as a live `vf.Trace` (the model's turns marked sampled, their tool calls parsed) that the task
scores with its own `score`; each reward and metric is logged as `env/<taskset>/<name>` and the
reward is their weighted sum, as verifiers computes `trace.reward`.

`<taskset>` is what verifiers' own loaders take (an installed taskset package, e.g. `reverse-text`,
or one of verifiers' built-in tasksets), or a dotted module path importable from the folder `rl`
runs in (e.g. `examples.verifiers_env.reverse_words`), which verifiers' loaders do not accept. The
module exports its `Taskset` subclass in `__all__`, and a multi-turn one its `Env` too; `args` are
the taskset's config fields, and `max_turns` (lorarl's: model turns of a tool or multi-turn episode).

What needs more than Python and lorarl's model is refused by `check`, in one line: a container or a
runtime for the task's hooks, judges (a model call of their own), `@vf.intercept` and request or
response `@vf.stop` hooks (they rewrite or refuse what the model sampled), tool servers that run
elsewhere, and envs with more than one agent (a simulated user is a second model). The classic
`SingleTurnEnv`/`MultiTurnEnv` API is only in verifiers <= 0.3, whose `mcp<2` pin conflicts with
vLLM 0.32's `mcp>=2` (see pyproject's `envs` extra).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import random
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from lorarl.orchestrator.envs.base import Environment, Episode, Example, Message
from lorarl.orchestrator.reward_calls import RewardTimeout, call_bounded
from lorarl.orchestrator.tools import TOOL_CALL, Toolbox, ToolCall, ToolStats, parse_tool_calls
from lorarl.plugins import import_user_module

try:
    import verifiers.v1 as vf
    from verifiers.v1.agent import Segment
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.session import call_hook, hook_boundary
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import content_text
    from verifiers.v1.utils.decorators import discover_decorated
    from verifiers.v1.utils.generic import concrete_type

    from lorarl.orchestrator.envs import verifiers_tools
    from lorarl.orchestrator.envs.verifiers_protocol import Exchange, env_config, make_env, seats
except ModuleNotFoundError as e:  # an optional extra
    raise ModuleNotFoundError(f"verifiers environments need verifiers: pip install 'lorarl[envs]' ({e})") from e

PREFIX = "verifiers"
# Model turns of a tool or multi-turn episode when neither args nor the env's seat set them.
DEFAULT_MAX_TURNS = 8
log = logging.getLogger("lorarl.orchestrator")
_ROLES: dict[str, type[Any]] = {"system": vf.SystemMessage, "user": vf.UserMessage}


def taskset_class(taskset_id: str) -> type[vf.Taskset[Any, Any]]:
    """The `Taskset` subclass that the module `taskset_id` names exports in `__all__`."""
    module = _import(taskset_id)
    found = _exported(module, vf.Taskset)
    if len(found) != 1:
        raise TypeError(
            f"verifiers taskset module {module.__name__!r} must export exactly one Taskset subclass in __all__, "
            f"found {[c.__name__ for c in found]}"
        )
    return found[0]


def env_class(taskset_id: str) -> type[vf.Env[Any]] | None:
    """The `Env` subclass the taskset's module exports beside it (a multi-turn task), if any."""
    module = _import(taskset_id)
    found = _exported(module, vf.Env)
    if len(found) > 1:
        raise TypeError(f"verifiers taskset module {module.__name__!r} exports {len(found)} Env subclasses, not one")
    return found[0] if found else None


def _exported(module: ModuleType, base: type) -> list[Any]:
    exported = [getattr(module, name, None) for name in getattr(module, "__all__", ())]
    return [c for c in exported if isinstance(c, type) and issubclass(c, base) and c is not base]


def _import(taskset_id: str) -> ModuleType:
    if not taskset_id:
        raise ValueError(f"name the taskset: id = '{PREFIX}:<taskset package or module>'")
    if "." in taskset_id:  # a module path (verifiers' loaders take package names only)
        return import_user_module(taskset_id)  # one line if the user's module fails to import
    return vf.import_taskset(taskset_id)


def taskset_config(taskset_id: str, args: dict[str, Any]) -> vf.TasksetConfig:
    """`args` validated as the taskset's config (its `TasksetConfig` subclass); one line on error."""
    cls = taskset_class(taskset_id)
    config_type = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    if "id" in args:
        raise ValueError("args.id: the taskset is the part of the id after 'verifiers:'")
    try:
        config: vf.TasksetConfig = config_type.model_validate({**args, "id": taskset_id})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ValueError(f"args do not fit {config_type.__name__}: {problems}") from None
    return config


def check_playable(cls: type[vf.Taskset[Any, Any]], config: vf.TasksetConfig, env: type[vf.Env[Any]] | None) -> None:
    """Refuse in one line what lorarl cannot play in-process (see the module docstring)."""
    task_type = cls.task_type()
    agents = seats(env) if env is not None else ["agent"]
    scoring = [*_hooks(task_type, config, "reward"), *_hooks(task_type, config, "metric")]
    stops = [f for f in _hooks(task_type, config, "stop") if hook_boundary(f, allow_trace=True) is not vf.Trace]
    needs = [
        what
        for what, present in (
            ("a container", task_type.NEEDS_CONTAINER),
            ("a runtime for its setup or finalize", _overrides(task_type, "setup", "finalize")),
            ("a runtime for its scoring", any(_needs_runtime(f) for f in scoring)),
            ("judges", config.task.judges),
            ("@vf.intercept hooks", _hooks(task_type, config, "intercept")),
            ("@vf.stop hooks on requests or responses", stops),
            (f"{len(agents)} agents ({', '.join(agents)})", len(agents) != 1),
        )
        if present
    ]
    if needs:
        raise ValueError(f"{cls.__name__} needs {' and '.join(needs)}, which lorarl cannot play")
    verifiers_tools.check([*cls.toolsets(config), *task_type.toolsets(config.task)], cls.__name__)


def _hooks(task_type: type[vf.Task], config: vf.TasksetConfig, attr: str) -> list[Callable[..., Any]]:
    """The task's `@vf.<attr>` methods (config-plugged ones included), known without its data."""
    probe = object.__new__(task_type)  # the hooks are the class's and its config's, not the data's
    probe.config = config.task
    return discover_decorated(probe, attr) if attr == "intercept" else probe.hooks(attr)


def _overrides(task_type: type[vf.Task], *hooks: str) -> bool:
    return any(getattr(task_type, hook) is not getattr(vf.Task, hook) for hook in hooks)


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    """verifiers skips such a reward without a runtime: it would go missing, not score."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def vf_messages(messages: list[Message]) -> list[Any]:
    """lorarl's messages as verifiers' typed ones. A model turn's `<tool_call>`s become its tool
    calls, and the `tool` messages after it (one per call, in order) answer them by position."""
    converted: list[Any] = []
    turn = answered = 0
    for m in messages:
        if m["role"] == "assistant":
            turn, answered = turn + 1, 0
            converted.append(assistant_message(m["content"], f"call_{turn}"))
        elif m["role"] == "tool":
            call_id = f"call_{turn}_{answered}"
            converted.append(vf.ToolMessage(tool_call_id=call_id, content=m["content"], name=m.get("name") or None))
            answered += 1
        else:
            converted.append(_ROLES[m["role"]](content=m["content"]))
    return converted


def assistant_message(text: str, call_prefix: str) -> vf.AssistantMessage:
    """A model turn as verifiers parses one: its well-formed tool calls apart from its text."""
    calls = [
        vf.ToolCall(id=f"{call_prefix}_{i}", name=c.name, arguments=json.dumps(c.arguments))
        for i, c in enumerate(parse_tool_calls(text))
        if isinstance(c, ToolCall)
    ]
    content = TOOL_CALL.sub("", text).strip() if calls else text
    return vf.AssistantMessage(content=content or None, tool_calls=calls or None)


class VerifiersTaskset(Environment):
    """A verifiers taskset (with its tools and `Env`, if any); an example is {"task": its data as JSON}."""

    def __init__(
        self,
        taskset: vf.Taskset[Any, Any],
        name: str,
        env_type: type[vf.Env[Any]] | None = None,
        max_turns: int | None = None,
    ) -> None:
        self.name, self.taskset = name, taskset
        self.task_type = taskset.task_type()
        self.data_type = self.task_type.data_type()
        self.rewards = []  # the task scores itself: see `score`
        self._tasks: list[Example] | None = None
        self.vf_env = make_env(env_type, taskset) if env_type is not None else None  # answers turns
        self.seat = seats(env_type)[0] if env_type is not None else "agent"
        self.shared_toolsets = verifiers_tools.SharedToolsets(type(taskset).toolsets(taskset.config))
        rollout_toolsets = self.task_type.toolsets(taskset.config.task)
        # The schemas the template shows (and a check of the names); each episode binds its own tools.
        self.schemas = verifiers_tools.toolbox([*self.shared_toolsets.toolsets, *rollout_toolsets], vf.State()).schemas
        if env_type is not None or self.schemas:
            seat_turns = getattr(env_config(env_type), self.seat).max_turns if env_type is not None else None
            self.max_turns = max_turns or seat_turns or DEFAULT_MAX_TURNS

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

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return self.schemas or None

    def solution(self, example: Example) -> str:
        if self.max_turns > 1:  # one answer is not an episode of tool calls or of the env's turns
            raise NotImplementedError(f"{self.name}: a tool or multi-turn task has no reference episodes")
        answer = example["task"].get("answer")
        if not isinstance(answer, str):
            raise NotImplementedError(f"{self.name}: its tasks have no string `answer` field")
        return answer

    def play(self, episode: Episode) -> Play:
        """The episode's verifiers side, made on first use."""
        if "verifiers" not in episode.state:
            episode.state["verifiers"] = Play(self, episode.example)
        play: Play = episode.state["verifiers"]
        play.sync(episode.messages)
        return play

    async def env_response(self, episode: Episode) -> list[Message] | None:
        """The results of the turn's tool calls; without calls the model's segment is over, and the
        env's `run` answers it (no env: the episode ends). A trace `@vf.stop` that fires ends it too."""
        play = self.play(episode)
        reply = await play.tool_results(episode.completion)
        if reply is None:
            return None
        if not reply and play.exchange is not None:
            reply = await play.exchange.reply(play.segment())
        if reply and await play.stopped():
            return None
        return reply or None

    async def score(self, episode: Episode) -> dict[str, float]:
        """The task's own rewards and metrics of the episode's trace (and its tool call counts);
        "reward" is the rewards' weighted sum. A reward left unscored or not finite (NaN, an
        infinity), a scoring error, a scoring past orchestrator.reward_timeout or a failed `Env` hook
        counts in "reward_errors" and scores 0, as a lorarl reward function does (base.py)."""
        play = self.play(episode)
        await play.finish()
        trace = play.trace
        metrics = {name: float(value) for name, value in trace.metrics.items() if value is not None}
        scored = {name: r for name, r in trace.rewards.items() if r and math.isfinite(float(r.score))}
        if len(scored) < len(trace.rewards) and play.errors == 0:
            log.warning("verifiers taskset %s: rewards %s unscored or not finite; scoring 0", self.name,
                        sorted(set(trace.rewards) - set(scored)))  # fmt: skip
        scores = metrics | {name: float(r.score) if name in scored else 0.0 for name, r in trace.rewards.items()}
        scores["reward"] = sum(r.value for r in scored.values())
        scores["reward_errors"] = max(play.errors, len(trace.rewards) - len(scored))
        return scores | (play.stats.as_metrics() if self.schemas else {})


class Play:
    """One episode's verifiers side: its task, the live trace, the rollout's tools, the exchange."""

    def __init__(self, env: VerifiersTaskset, example: Example) -> None:
        self.env, self.task = env, env.task(example)
        self.trace = vf.Trace(
            task=TraceTask(type=env.task_type.__name__, data=self.task.data),
            agent=AgentInfo(config=vf.AgentConfig()),
            state=state_cls(env.task_type)(),
        )
        self.n_prompt = self.delivered = len(env.prompt(example))  # `delivered`: messages `run` has seen
        self.stats, self.errors, self.scored = ToolStats(), 0, False
        self.rollout_toolsets: list[vf.Toolset[Any, Any]] = []
        self.toolbox: Toolbox | None = None
        self.exchange = (
            Exchange(env.vf_env, self.task, self.trace, env.seat, self.score_task) if env.vf_env is not None else None
        )

    def sync(self, messages: list[Message]) -> None:
        """Add the episode's new messages to the trace; the model's turns are the sampled ones."""
        converted = vf_messages(messages)
        for i in range(len(self.trace.nodes), len(converted)):
            sampled = i >= self.n_prompt and converted[i].role == "assistant"
            self.trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=converted[i], sampled=sampled))

    async def tool_results(self, text: str) -> list[Message] | None:
        """One `tool` message per call in the model's turn (none: no calls, or no tools); None if
        the tools failed to set up, which ends the episode."""
        if not self.env.schemas:
            return []
        if self.toolbox is None:
            try:
                shared = await self.env.shared_toolsets.ready()
                self.rollout_toolsets = self.env.task_type.toolsets(self.task.config)
                await verifiers_tools.setup_for_task(self.rollout_toolsets, self.task)
            except Exception as e:
                self._failed("its tools failed to set up", e)
                return None
            self.toolbox = verifiers_tools.toolbox([*shared, *self.rollout_toolsets], self.trace.state)
        return await self.toolbox.respond(text, self.stats)

    def segment(self) -> Segment:
        """What the model did since `run` last heard from it: its turns and their tool results."""
        messages = [n.message for n in self.trace.nodes[self.delivered :]]
        self.delivered = len(self.trace.nodes)
        return Segment(messages=messages)

    async def stopped(self) -> bool:
        """Whether a trace `@vf.stop` of the task refuses the next model turn, as verifiers checks them."""
        try:
            for stop in self.task.hooks("stop"):
                if await call_hook(stop, {vf.Trace: self.trace}):
                    self.trace.stop(stop.__name__)
                    return True
        except Exception as e:
            self._failed("a @vf.stop raised", e)
            return True
        return False

    async def finish(self) -> None:
        """End the episode: `run` hears the model's last segment, then the exchange ends (leaving the
        interaction scores the task); without an env, the task scores the trace here."""
        if self.exchange is not None:
            if self.delivered < len(self.trace.nodes):
                await self.exchange.reply(self.segment())
            await self.exchange.finish()
            self.errors += self.exchange.error is not None
        else:
            await self.score_task()
        await verifiers_tools.close(self.rollout_toolsets)

    async def score_task(self) -> None:
        if self.scored:
            return
        self.scored = True
        try:  # records every reward first as None (unscored), then its score; bounded as lorarl's rewards are
            await call_bounded(self.task.score, self.trace, self.env.reward_timeout, f"scoring of {self.env.name}")
        except RewardTimeout:
            log.warning("verifiers task of %s scored past %g s (orchestrator.reward_timeout); scoring 0",
                        self.env.name, self.env.reward_timeout)  # fmt: skip
            self.errors += 1
        except Exception:
            log.exception("verifiers task of %s failed to score; scoring 0", self.env.name)
            self.errors += 1

    def _failed(self, what: str, error: Exception) -> None:
        log.warning("verifiers taskset %s: %s, ending the episode: %r", self.env.name, what, error)
        self.errors += 1


def _split_args(args: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """lorarl's own `max_turns` apart from the taskset's config fields."""
    rest = dict(args)
    max_turns = rest.pop("max_turns", None)
    if max_turns is not None and (not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1):
        raise ValueError(f"args.max_turns: model turns per episode, an integer >= 1, got {max_turns!r}")
    return rest, max_turns


def check(task: str | None, args: dict[str, Any]) -> None:
    rest, _ = _split_args(args)
    config = taskset_config(task or "", rest)
    check_playable(taskset_class(config.id), config, env_class(config.id))


def load(task: str | None, args: dict[str, Any]) -> VerifiersTaskset:
    check(task, args)
    rest, max_turns = _split_args(args)
    config = taskset_config(task or "", rest)
    taskset = taskset_class(config.id)(config)
    return VerifiersTaskset(taskset, config.id.rsplit(".", 1)[-1], env_class(config.id), max_turns)
