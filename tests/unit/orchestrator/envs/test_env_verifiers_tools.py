"""verifiers tool tasksets: the task's `vf.Toolset`s are called in-process as lorarl tools, shown to
the model as verifiers' MCP server advertises them, with the episode's trace state as their `state`;
the episode is played (and its tokens kept) by lorarl's EpisodeRunner, and what cannot run
in-process is refused in one line."""

import asyncio
import random

import pytest
import verifiers.v1 as vf
from mcp.server.mcpserver import MCPServer

from examples.verifiers_env.price_lookup import PRICES, Shop
from lorarl.config.orchestrator import SamplingConfig
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Example
from lorarl.orchestrator.envs.verifiers_env import VerifiersTaskset, check_playable, vf_messages
from lorarl.orchestrator.episodes import EpisodeRunner
from lorarl.tiny_model import build_tokenizer
from tests.conftest import REPO
from tests.unit.orchestrator.envs.env_play import play_and_score, play_turns
from tests.unit.orchestrator.test_episodes import ScriptedPool

PRICE_LOOKUP = "verifiers:examples.verifiers_env.price_lookup"


@pytest.fixture(autouse=True)
def repo_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # examples/ resolves from the repo root, as under `rl`


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def lookups(example: Example) -> str:
    return "".join(call("shop_price", f'{{"item": "{item}"}}') for item in example["task"]["basket"])


def test_the_tools_are_shown_as_verifiers_mcp_server_lists_them() -> None:
    env = load_environment(PRICE_LOOKUP, {})
    server = MCPServer("shop")
    Shop(vf.ToolsetConfig()).register(server)
    (listed,) = asyncio.run(server.list_tools())
    assert env.tool_schemas() == [
        {
            "type": "function",
            "function": {"name": "shop_price", "description": listed.description, "parameters": listed.input_schema},
        }
    ]
    assert env.max_turns == 8  # tools: several model turns (args.max_turns sets them)
    with pytest.raises(NotImplementedError, match="price_lookup: a tool or multi-turn task has no reference episodes"):
        env.solution(next(env.examples(random.Random(0))))  # its `answer` alone is no episode to learn from
    assert load_environment(PRICE_LOOKUP, {"max_turns": 3}).max_turns == 3


def test_a_tool_episode_trains_on_the_sampled_tokens_and_the_task_scores_its_trace() -> None:
    tok = build_tokenizer()
    env = load_environment(PRICE_LOOKUP, {"num_tasks": 1})
    example = next(env.examples(random.Random(0)))
    answers = [lookups(example), f"<answer>{example['task']['answer']}</answer>"]
    pool = ScriptedPool(tok, list(answers))
    runner = EpisodeRunner(pool, tok, SamplingConfig(), seq_len=4096)
    runner.check(env)  # the tiny model's template shows the tools

    async def run() -> tuple[list, dict[str, float]]:
        played = await runner.play("adapter", env, example, n=1)
        return played, await env.score(played[0].episode)

    (played,), scores = asyncio.run(run())
    assert "shop_price" in tok.decode(pool.prompts[0])
    (sample,) = played.samples
    trained = tok.decode([t for t, m in zip(sample.completion_ids, sample.completion_mask, strict=True) if m])
    assert trained == "<|im_end|>".join(answers) + "<|im_end|>"
    basket = example["task"]["basket"]
    tool_results = [m["content"] for m in played.episode.messages if m["role"] == "tool"]
    assert tool_results == [str(PRICES[item]) for item in basket]
    assert scores == {
        "correct": 1.0, "lookups": float(len(basket)), "looked_up_all": 1.0, "reward": 1.0, "reward_errors": 0,
        "tool_calls": float(len(basket)), "tool_malformed": 0.0, "tool_failed": 0.0, "tool_timeouts": 0.0,
    }  # fmt: skip


def test_each_episode_has_its_own_tools_and_state() -> None:
    env = load_environment(PRICE_LOOKUP, {"num_tasks": 1})
    example = next(env.examples(random.Random(0)))
    _, looked = play_and_score(env, example, [lookups(example), "<answer>0</answer>"])
    _, guessed = play_and_score(env, example, [f"<answer>{example['task']['answer']}</answer>"])
    assert looked["looked_up_all"] == 1.0 and looked["correct"] == 0.0
    assert guessed["looked_up_all"] == 0.0 and guessed["correct"] == 1.0 and guessed["tool_calls"] == 0.0


def test_tool_mistakes_are_answered_to_the_model_and_counted() -> None:
    env = load_environment(PRICE_LOOKUP, {"num_tasks": 1})
    example = next(env.examples(random.Random(0)))
    bad = call("shop_price", '{"item": "kiwi"}') + call("price", '{"item": "apple"}') + call("shop_price", "{}")
    episode, scores = play_and_score(env, example, [bad, "<answer>1</answer>"])
    results = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert results[0].startswith("The shop has no 'kiwi'")  # the tool's own answer
    assert results[1].startswith("Error: there is no tool 'price'; the tools are ['shop_price']")
    assert results[2].startswith("Error: wrong arguments for shop_price")
    assert (scores["tool_calls"], scores["tool_malformed"], scores["lookups"]) == (3.0, 2.0, 3.0)


def test_the_trace_holds_the_model_turns_tool_calls_apart_from_their_text() -> None:
    text = "Let me look.\n" + call("shop_price", '{"item": "pear"}') + call("shop_price", "[1]")
    converted = vf_messages([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": text},
        {"role": "tool", "name": "shop_price", "content": "55"},
        {"role": "tool", "name": "", "content": "Error: ..."},
        {"role": "assistant", "content": "<answer>55</answer>"},
    ])  # fmt: skip
    turn = converted[1]
    assert turn.content == "Let me look." and [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_1_0", "shop_price", '{"item": "pear"}')
    ]  # the malformed second call stays unparsed, yet its result keeps its position
    assert [(m.tool_call_id, m.name) for m in converted[2:4]] == [("call_1_0", "shop_price"), ("call_1_1", None)]
    assert converted[4].content == "<answer>55</answer>" and converted[4].tool_calls is None


class Data(vf.TaskData):
    answer: str = "4"


class FlakyTools(vf.Toolset[vf.ToolsetConfig]):
    async def setup_task(self, task) -> None:
        raise RuntimeError("no database")

    @vf.tool
    async def lookup(self, key: str) -> str:
        """Look a key up."""
        return key


class FlakyTask(vf.Task[Data]):
    @classmethod
    def toolsets(cls, config):
        return [FlakyTools(vf.ToolsetConfig())]

    @vf.reward
    async def right(self, task: Data, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)


class Flaky(vf.Taskset[FlakyTask]):
    def load(self):
        yield FlakyTask(Data(prompt="2+2?"))


def test_tools_that_fail_to_set_up_end_the_episode_and_are_counted() -> None:
    env = VerifiersTaskset(Flaky(vf.TasksetConfig()), "flaky")
    example = next(env.examples(random.Random(0)))
    episode, scores = play_and_score(env, example, [call("flaky_tools_lookup", '{"key": "a"}'), "4"])
    assert len(episode.turns) == 1 and scores["reward_errors"] == 1 and scores["reward"] == 0.0


class Remote(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    async def ping(self) -> str:
        """Ping."""
        return "pong"


def remote_taskset(config: vf.ToolsetConfig) -> type[vf.Taskset]:
    class RemoteTask(vf.Task[Data]):
        @classmethod
        def toolsets(cls, task_config):
            return [Remote(config)]

    class Remotes(vf.Taskset[RemoteTask]):
        def load(self):
            yield from ()

    return Remotes


@pytest.mark.parametrize(
    "config, where",
    [
        (vf.ToolsetConfig(url="http://tools:8000/mcp"), "http://tools:8000/mcp"),
        (vf.ToolsetConfig(runtime={"type": "docker"}), "a docker runtime"),
    ],
)
def test_tool_servers_that_run_elsewhere_are_refused_in_one_line(config: vf.ToolsetConfig, where: str) -> None:
    with pytest.raises(ValueError) as error:
        check_playable(remote_taskset(config), vf.TasksetConfig(), None)
    assert str(error.value) == f"Remotes: its tool server Remote runs in {where}; lorarl runs tool servers in-process"


class Counter(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = None  # listed bare: `count`
    setups = 0

    async def setup(self) -> None:
        Counter.setups += 1
        self.calls = 0

    @vf.tool
    def count(self) -> int:
        """How many calls so far, this one included, across every rollout."""
        self.calls += 1
        return self.calls


class Counted(vf.Taskset[vf.Task[Data]]):
    @classmethod
    def toolsets(cls, config):
        return [Counter(vf.SharedToolsetConfig())]

    def load(self):
        yield vf.Task(Data(prompt="Count."))


def test_a_tasksets_tools_are_set_up_once_and_shared_by_its_episodes() -> None:
    Counter.setups = 0
    env = VerifiersTaskset(Counted(vf.TasksetConfig()), "counted")
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["count"]
    example = next(env.examples(random.Random(0)))

    async def two_episodes() -> list[str]:
        episodes = await asyncio.gather(*(play_turns(env, example, [call("count", "{}"), "4"]) for _ in range(2)))
        return sorted(m["content"] for e in episodes for m in e.messages if m["role"] == "tool")

    assert asyncio.run(two_episodes()) == ["1", "2"] and Counter.setups == 1
