"""verifiers tasksets as environments: the taskset's rows become seeded examples and chat prompts, the
task's own weighted rewards and metrics score the episode (as a verifiers Trace whose model turn is
the sampled one), and `check_environment` refuses what lorarl cannot play in one line. Tool and
multi-turn tasksets: test_env_verifiers_tools.py, test_env_verifiers_multiturn.py."""

import asyncio
import random
import re
import tomllib
from itertools import islice

import pytest
import verifiers.v1 as vf

from lorarl.orchestrator.envs import check_environment, load_environment
from lorarl.orchestrator.envs.base import Environment, Episode, Example
from lorarl.orchestrator.envs.verifiers_env import VerifiersTaskset, check_playable
from tests.conftest import REPO

REVERSE = "verifiers:examples.verifiers_env.reverse_words"


@pytest.fixture(autouse=True)
def repo_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # examples/ resolves from the repo root, as under `rl`


def score(env: Environment, example: Example, completion: str) -> dict[str, float]:
    messages = [*env.prompt(example), {"role": "assistant", "content": completion}]
    return asyncio.run(env.score(Episode(example, messages)))


def test_rows_become_prompts_and_every_pass_visits_each_task_in_a_seeded_order() -> None:
    env = load_environment(REVERSE, {"num_words": 4})
    assert env.name == "reverse_words"
    drawn = [example["task"]["answer"] for example in islice(env.examples(random.Random(5)), 8)]
    assert sorted(drawn[:4]) == sorted(drawn[4:]) == sorted(["elppa", "revir", "enots", "duolc"])
    assert drawn == [e["task"]["answer"] for e in islice(env.examples(random.Random(5)), 8)]
    assert env.prompt({"task": {"prompt": "Reverse the word: apple", "system_prompt": "Be brief.", "answer": "x"}}) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Reverse the word: apple"},
    ]


def test_each_reward_and_metric_is_scored_and_the_reward_is_their_weighted_sum() -> None:
    env = load_environment(REVERSE, {"num_words": 1})
    example = next(env.examples(random.Random(0)))
    assert score(env, example, env.solution(example)) == {
        "exact": 1.0, "similarity": 1.0, "reply_chars": 5.0, "reward": 1.5, "reward_errors": 0
    }  # fmt: skip
    half = score(env, example, "elp")
    assert half["exact"] == 0.0 and half["similarity"] == pytest.approx(0.75)
    assert half["reward"] == pytest.approx(0.5 * 0.75)


class Data(vf.TaskData):
    answer: str = "42"


class Shaky(vf.Task[Data]):
    @vf.reward(weight=2.0)
    async def right(self, task: Data, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

    @vf.reward
    async def keyed(self, trace: vf.Trace) -> dict[str, float]:
        if "boom" in trace.last_reply:
            raise RuntimeError("boom")
        return {"turns": float(len(trace.assistant_messages)), "few_shot": float(len(trace.messages))}


class Shakies(vf.Taskset[Shaky]):
    def load(self):
        prompt = [vf.UserMessage(content="6*7?"), vf.AssistantMessage(content="42"), vf.UserMessage(content="6*8?")]
        yield Shaky(Data(prompt=prompt, answer="48"))


def test_keyed_rewards_count_and_only_the_model_turn_is_sampled() -> None:
    env = VerifiersTaskset(Shakies(vf.TasksetConfig()), "shakies")
    example = next(env.examples(random.Random(0)))
    assert [m["role"] for m in env.prompt(example)] == ["user", "assistant", "user"]
    # The few-shot answer in the prompt is context, not a model turn: one sampled turn of four messages.
    # Keyed scores are rewards of weight 1 each, beside `right` (weight 2).
    assert score(env, example, "48") == {
        "right": 1.0, "turns": 1.0, "few_shot": 4.0, "reward": 2.0 + 1.0 + 4.0, "reward_errors": 0
    }  # fmt: skip


def test_a_reward_that_raises_scores_zero_and_is_counted_without_stopping() -> None:
    env = VerifiersTaskset(Shakies(vf.TasksetConfig()), "shakies")
    scores = score(env, next(env.examples(random.Random(0))), "48 boom")
    assert scores["reward"] == 0.0 and scores["reward_errors"] >= 1


class Unbounded(vf.Task[Data]):
    @vf.reward
    async def sure(self, trace: vf.Trace) -> float:
        return 1.0

    @vf.reward
    async def wild(self, trace: vf.Trace) -> float:
        if "slow" in trace.last_reply:
            await asyncio.sleep(30)
        return float(trace.last_reply.split()[-1])  # "nan", "inf" or a number


class Unboundeds(vf.Taskset[Unbounded]):
    def load(self):
        yield Unbounded(Data(prompt="?"))


@pytest.mark.parametrize("reply", ["nan", "-inf", "slow 1"])
def test_a_reward_not_finite_or_past_the_timeout_scores_zero_and_is_counted(reply: str) -> None:
    """As a lorarl reward function is (base.py): never a NaN reaching the advantages, never a held run."""
    env = VerifiersTaskset(Unboundeds(vf.TasksetConfig()), "unbounded")
    env.reward_timeout = 0.5
    scores = score(env, next(env.examples(random.Random(0))), reply)
    assert scores["wild"] == 0.0 and scores["reward_errors"] >= 1, scores
    assert scores["reward"] in (0.0, 1.0)  # the finite reward kept, or every one unscored (the timeout)
    assert score(env, next(env.examples(random.Random(0))), "2")["reward"] == 3.0


class Endless(vf.Taskset[Shaky]):
    INFINITE = True

    def load(self):
        n = 0
        while True:
            n += 1
            yield Shaky(Data(prompt=f"{n}?", answer=str(n)))


def test_an_endless_taskset_is_streamed_in_its_own_order() -> None:
    env = VerifiersTaskset(Endless(vf.TasksetConfig()), "endless")
    assert [e["task"]["answer"] for e in islice(env.examples(random.Random(0)), 3)] == ["1", "2", "3"]


class Tooled(vf.Taskset[Shaky]):
    @classmethod
    def toolsets(cls, config):
        return [object()]

    def load(self):
        yield from ()


class Boxed(vf.Task[Data]):
    NEEDS_CONTAINER = True

    async def setup(self, trace, runtime) -> None:  # writes into the task's box
        pass

    @vf.reward
    async def tests_pass(self, trace: vf.Trace, runtime: vf.Runtime) -> float:  # reads the box
        return 1.0

    @vf.intercept
    async def rewrite(self, response: vf.Response) -> vf.Response | None:
        return None

    @vf.stop
    async def on_request(self, request: vf.Request) -> bool:
        return False


class Boxes(vf.Taskset[Boxed]):
    def load(self):
        yield from ()


def test_what_lorarl_cannot_play_is_refused_in_one_line_naming_it() -> None:
    with pytest.raises(ValueError, match="Tooled: its tool server object is not a vf.Toolset of @vf.tool methods"):
        check_playable(Tooled, vf.TasksetConfig(), None)
    judged = vf.TasksetConfig(task={"judges": [{"id": "reference"}]})
    with pytest.raises(ValueError, match="^Shakies needs judges, which lorarl cannot play$"):
        check_playable(Shakies, judged, None)
    with pytest.raises(ValueError) as error:
        check_playable(Boxes, vf.TasksetConfig(), None)
    assert str(error.value) == (
        "Boxes needs a container and a runtime for its setup or finalize and a runtime for its scoring and "
        "@vf.intercept hooks and @vf.stop hooks on requests or responses, which lorarl cannot play"
    )
    check_playable(Shakies, vf.TasksetConfig(), None)  # a plain task passes


@pytest.mark.parametrize(
    "env_id, args, message",
    [
        ("verifiers", {}, "name the taskset: id = 'verifiers:<taskset package or module>'"),
        (REVERSE, {"num_word": 3}, "args do not fit ReverseWordsConfig: num_word: Extra inputs are not permitted"),
        (REVERSE, {"num_words": "a"}, "args do not fit ReverseWordsConfig: num_words: Input should be a valid integer"),
        (REVERSE, {"id": "x"}, "args.id: the taskset is the part of the id after 'verifiers:'"),
        (REVERSE, {"max_turns": 0}, "args.max_turns: model turns per episode, an integer >= 1, got 0"),
        ("verifiers:examples.verifiers_env.nope", {}, "No module named 'examples.verifiers_env.nope'"),
        ("verifiers:no-such-taskset", {}, "taskset 'no-such-taskset' not found"),
        ("verifiers:examples.custom_environment.my_env", {}, "must export exactly one Taskset subclass in __all__"),
    ],
)
def test_bad_ids_and_args_are_one_line_errors(env_id: str, args: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError, ImportError)) as error:
        check_environment(env_id, args)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_docs_example_passes_the_check() -> None:
    page = (REPO / "docs" / "environments.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", page, re.DOTALL) if '"verifiers:' in b]
    envs = [env for block in blocks for env in tomllib.loads(block)["orchestrator"]["env"]]
    assert len(envs) == 1
    check_environment(envs[0]["id"], envs[0].get("args", {}))
