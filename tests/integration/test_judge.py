"""The judge through a real vLLM server: it asks the base model (no adapter) of the fleet, parses
the grade when the reply holds one, and counts a reply without one, or no reply in time, as a
reward error. The tiny model cannot grade, so the first test lets vLLM constrain its reply to
"Score: N/10" (reply_format = "score_only"); the grade N is still the model's own sample."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lorarl.inference.pool import WorkerPool
from lorarl.orchestrator import judge as judge_module
from lorarl.orchestrator.envs.base import Environment, Episode, WeightedReward
from lorarl.orchestrator.judge import Judge, use_fleet
from tests.conftest import API_KEY

pytestmark = pytest.mark.integration

EPISODE = Episode({}, [{"role": "user", "content": "Describe the otter."},
                       {"role": "assistant", "content": "The otter is a playful river animal."}])  # fmt: skip


class Recorded(WorkerPool):
    """The real pool, remembering each chat request's model and reply."""

    def __init__(self, url: str) -> None:
        super().__init__([url], API_KEY)
        self.asked: list[tuple[str, str]] = []

    async def chat(self, model: str, messages: list[dict[str, str]], **params: Any) -> str:
        reply = await super().chat(model, messages, **params)
        self.asked.append((model, reply))
        return reply


def score_with(url: str, tiny_model: Path, judge: Judge) -> tuple[dict[str, float], Recorded]:
    class Judged(Environment):
        name = "judged"
        rewards = [WeightedReward(judge)]

    async def run() -> dict[str, float]:
        try:
            return await Judged().score(EPISODE)
        finally:
            await pool.close()

    pool = Recorded(url)
    use_fleet(pool, str(tiny_model))
    try:
        return asyncio.run(run()), pool
    finally:
        judge_module._fleet = None


def test_the_judge_grades_through_the_fleets_base_model(vllm_server: str, tiny_model: Path) -> None:
    scores, pool = score_with(vllm_server, tiny_model, Judge("Accurate and vivid?", reply_format="score_only"))
    ((model, reply),) = pool.asked
    assert model == str(tiny_model)  # the base model: no adapter is loaded or asked for
    grade = int(reply.removeprefix("Score: ").removesuffix("/10"))
    assert reply == f"Score: {grade}/10" and scores == {"judge": grade / 10, "reward": grade / 10, "reward_errors": 0}


def test_a_reply_without_a_grade_or_in_time_is_a_reward_error(vllm_server: str, tiny_model: Path) -> None:
    scores, pool = score_with(vllm_server, tiny_model, Judge("Accurate?", max_tokens=16, retries=1))
    assert len(pool.asked) == 2 and all(model == str(tiny_model) for model, _ in pool.asked)  # asked again once
    assert scores == {"judge": 0.0, "reward": 0.0, "reward_errors": 1}  # the untrained model writes no grade
    scores, pool = score_with(vllm_server, tiny_model, Judge("Accurate?", max_tokens=512, timeout=0.001, retries=0))
    assert scores["reward_errors"] == 1 and pool.asked == []
