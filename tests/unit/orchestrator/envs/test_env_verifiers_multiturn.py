"""Multi-turn verifiers tasksets: the `vf.Env` exported beside the taskset answers the model turn by
turn from its own `run`, with lorarl's episode runner as its agent; the runner's limits end the
exchange as verifiers' would, the task scores the trace, and failures are counted, not raised."""

import asyncio
import random

import pytest
import verifiers.v1 as vf

from lorarl.config.orchestrator import SamplingConfig
from lorarl.orchestrator.envs import check_environment, load_environment
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.envs.verifiers_env import VerifiersTaskset, check_playable
from lorarl.orchestrator.envs.verifiers_protocol import user_messages
from lorarl.orchestrator.episodes import EpisodeRunner
from lorarl.tiny_model import build_tokenizer
from tests.conftest import REPO
from tests.unit.orchestrator.envs.env_play import play_and_score
from tests.unit.orchestrator.test_episodes import ScriptedPool

GUESS = "verifiers:examples.verifiers_env.guess_number"


@pytest.fixture(autouse=True)
def repo_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # examples/ resolves from the repo root, as under `rl`


def guess_example() -> tuple[Environment, Example, int]:
    env = load_environment(GUESS, {"num_tasks": 1, "high": 10})
    example = next(env.examples(random.Random(0)))
    return env, example, example["task"]["secret"]


def test_the_envs_run_answers_each_guess_until_it_ends_the_exchange() -> None:
    env, example, secret = guess_example()
    assert env.max_turns == 4  # its seat's max_turns
    low, high = secret - 1, secret + 1
    episode, scores = play_and_score(env, example, [str(low), f"maybe {high}", "no idea", str(secret), "9"])
    assert [m["content"] for m in episode.messages if m["role"] == "user"][1:] == [
        "Higher.",
        "Lower.",
        "Reply with a number.",
    ]
    assert episode.turns[-1] == str(secret)  # found: run returned, the episode ended
    assert scores == {
        "solved": 1.0, "closeness": 1.0, "guesses": 4.0, "hints": 3.0, "reward": 1.5, "reward_errors": 0
    }  # fmt: skip


def test_where_the_runner_stops_the_last_turn_still_reaches_run() -> None:
    env, example, secret = guess_example()
    env.max_turns = 2
    wrong = str(secret % 10 + 1)
    episode, scores = play_and_score(env, example, [wrong, wrong, wrong])
    assert len(episode.turns) == 2
    # run heard both guesses (two hints), then its next turn came back terminated and it returned.
    assert scores["hints"] == 2.0 and scores["guesses"] == 2.0 and scores["solved"] == 0.0
    assert load_environment(GUESS, {"max_turns": 6}).max_turns == 6


def test_a_multi_turn_episode_through_the_runner_trains_on_the_sampled_tokens() -> None:
    tok = build_tokenizer()
    env, example, secret = guess_example()
    answers = ["0", str(secret)]
    runner = EpisodeRunner(ScriptedPool(tok, list(answers)), tok, SamplingConfig(), seq_len=2048)

    async def run() -> tuple[list, dict[str, float]]:
        played = await runner.play("adapter", env, example, n=1)
        return played, await env.score(played[0].episode)

    (played,), scores = asyncio.run(run())
    (sample,) = played.samples
    trained = tok.decode([t for t, m in zip(sample.completion_ids, sample.completion_mask, strict=True) if m])
    assert trained == f"0<|im_end|>{secret}<|im_end|>"
    hint = tok.decode([t for t, m in zip(sample.completion_ids, sample.completion_mask, strict=True) if not m])
    assert hint == "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
    assert scores["solved"] == 1.0 and scores["hints"] == 1.0


class Data(vf.TaskData):
    answer: str = "4"


class Sum(vf.Task[Data]):
    @vf.reward
    async def right(self, task: Data, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

    @vf.stop
    async def gave_up(self, trace: vf.Trace) -> bool:
        return "give up" in trace.last_reply


class Sums(vf.Taskset[Sum]):
    def load(self):
        yield Sum(Data(prompt="2+2?"))


class OneSeat(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class Nagging(vf.Env[OneSeat]):
    """Asks again until the answer is right."""

    async def run(self, task: Sum, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated and segment.last_reply != task.data.answer:
                if segment.last_reply == "crash":
                    raise RuntimeError("the game engine crashed")
                segment = await interaction.turn("Try again.")


def nagging(env: type[vf.Env] = Nagging) -> tuple[Environment, Example]:
    env = VerifiersTaskset(Sums(vf.TasksetConfig()), "sums", env)
    return env, next(env.examples(random.Random(0)))


def test_a_trace_stop_of_the_task_ends_the_episode() -> None:
    env, example = nagging()
    episode, scores = play_and_score(env, example, ["5", "I give up", "4"])
    assert episode.turns == ["5", "I give up"] and scores["right"] == 0.0
    assert episode.state["verifiers"].trace.stop_condition == "gave_up"


def test_an_env_that_fails_ends_its_episode_and_is_counted() -> None:
    env, example = nagging()
    episode, scores = play_and_score(env, example, ["5", "crash", "4"])
    assert episode.turns == ["5", "crash"]
    assert scores["reward_errors"] == 1  # its interaction still scored the trace
    assert scores["right"] == 0.0


class OwnTask(vf.Env[OneSeat]):
    async def run(self, task: Sum, agents: vf.Agents) -> None:
        other = Sum(task.data.model_copy(update={"prompt": "3+3?"}))
        async with agents.agent.interaction(other) as interaction:
            await interaction.turn()


def test_an_env_that_hands_the_seat_a_task_of_its_own_is_counted() -> None:
    env, example = nagging(OwnTask)
    _, scores = play_and_score(env, example, ["4"])
    assert scores == {"reward": 0.0, "reward_errors": 1}


class TwoSeats(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    user: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})


class Simulated(vf.Env[TwoSeats]):
    async def run(self, task: Sum, agents: vf.Agents) -> None:
        pass


def test_an_env_of_two_agents_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^Sums needs 2 agents \(solver, user\), which lorarl cannot play$"):
        check_playable(Sums, vf.TasksetConfig(), Simulated)
    check_playable(Sums, vf.TasksetConfig(), Nagging)
    check_environment(GUESS, {"max_turns": 2})


def test_a_user_turn_may_be_text_typed_or_wire_messages() -> None:
    assert user_messages("Higher.") == [{"role": "user", "content": "Higher."}]
    typed, wire = vf.UserMessage(content="a"), {"role": "user", "content": [{"type": "text", "text": "b"}]}
    assert user_messages([typed, wire]) == [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
