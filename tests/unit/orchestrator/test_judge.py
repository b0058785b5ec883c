"""The judge reward function: the request it makes, score parsing, retries, timeouts and errors,
with a stand-in for the vLLM fleet (tests/integration/test_judge.py asks a real server)."""

import asyncio

import pytest

from lorarl.inference.client import InferenceError
from lorarl.orchestrator import judge as judge_module
from lorarl.orchestrator.envs.base import Environment, Episode, WeightedReward
from lorarl.orchestrator.judge import Judge, JudgeError, parse_score

EPISODE = Episode({}, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                       {"role": "assistant", "content": "Paris."}])  # fmt: skip


class Fleet:
    """Answers chat requests with scripted replies (an exception is raised, a float is a delay)."""

    def __init__(self, *replies) -> None:
        self.replies, self.requests = list(replies), []

    async def chat(self, model, messages, **params):
        self.requests.append((model, messages, params))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, float):
            await asyncio.sleep(reply)
        return reply


@pytest.fixture
def fleet(monkeypatch):
    def use(*replies):
        fleet = Fleet(*replies)
        monkeypatch.setattr(judge_module, "_fleet", (fleet, "base-model"))
        return fleet

    return use


@pytest.mark.parametrize(
    "reply, score",
    [
        ("Clear and right.\nScore: 7/10", 0.7),
        ("score: 10 / 10", 1.0),
        ("**Score:** 3", 0.3),  # no denominator: the judge's scale
        ("Score: 0.5/1", 0.5),
        ("First Score: 2/10, on reflection Score: 9/10", 0.9),  # the last one counts
        ("Score: 11/10", None),
        ("I would give it a 7.", None),
        ("Score: 3/0", None),
    ],
)
def test_scores_are_parsed_as_fractions_of_their_scale(reply: str, score: float | None) -> None:
    assert parse_score(reply, 10) == score


def test_the_judge_asks_the_fleets_base_model_with_the_rubric_and_the_conversation(fleet) -> None:
    f = fleet("Score: 8/10")
    assert asyncio.run(Judge("Is it right?", temperature=0.0, max_tokens=64)(EPISODE)) == 0.8
    ((model, messages, params),) = f.requests
    assert model == "base-model" and params == {"max_tokens": 64, "temperature": 0.0}
    ask = messages[-1]["content"]
    assert "Rubric:\nIs it right?" in ask and "[user]\nCapital of France?\n\n[assistant]\nParis." in ask
    assert "Be brief." not in ask and "Score: N/10" in ask


def test_score_only_constrains_the_reply_with_structured_outputs(fleet) -> None:
    f = fleet("Score: 2/4")
    assert asyncio.run(Judge("ok?", scale=4, reply_format="score_only")(EPISODE)) == 0.5
    assert f.requests[0][2]["structured_outputs"] == {"regex": "Score: (4|3|2|1|0)/4"}


def test_failures_are_retried_then_raise(fleet) -> None:
    f = fleet(InferenceError("400 bad request"), 5.0, "no grade here", "Score: 6/10")
    assert asyncio.run(Judge("ok?", retries=3, timeout=0.1)(EPISODE)) == 0.6
    assert len(f.requests) == 4
    fleet("nothing", "still nothing")
    with pytest.raises(JudgeError, match="no grade in 2 attempts; last: no score in \\[0, 10\\] in the reply 'still"):
        asyncio.run(Judge("ok?", retries=1)(EPISODE))


def test_a_judge_that_gives_no_grade_is_a_counted_reward_error(fleet) -> None:
    class Judged(Environment):
        name = "judged"
        rewards = [WeightedReward(Judge("ok?", retries=0)), WeightedReward(lambda e: 1.0, 0.5)]

    fleet("Score: 4/10")
    assert asyncio.run(Judged().score(EPISODE)) == {"judge": 0.4, "<lambda>": 1.0, "reward": 0.9, "reward_errors": 0}
    fleet("no grade")
    assert asyncio.run(Judged().score(EPISODE)) == {"judge": 0.0, "<lambda>": 1.0, "reward": 0.5, "reward_errors": 1}


def test_without_a_fleet_or_base_url_the_judge_says_so(monkeypatch) -> None:
    monkeypatch.setattr(judge_module, "_fleet", None)
    with pytest.raises(JudgeError, match="no judge server"):
        asyncio.run(Judge("ok?", retries=0)(EPISODE))
    with pytest.raises(ValueError, match="needs the model name"):
        Judge("ok?", base_url="http://127.0.0.1:1")
