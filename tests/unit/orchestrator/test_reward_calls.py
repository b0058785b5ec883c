"""Reward calls are bounded (reward_calls.py): one that never returns scores 0 after its timeout, is
counted in reward_errors, holds neither the event loop nor the process's exit, and is named while it runs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from lorarl.orchestrator import reward_calls
from lorarl.orchestrator.envs.base import Environment, Episode, WeightedReward

FOREVER = threading.Event()  # never set: a reward waiting on it never returns


def hangs(ep: Episode) -> float:
    FOREVER.wait()
    return 1.0


async def awaits_forever(ep: Episode) -> float:
    await asyncio.Event().wait()
    return 1.0


def quick(ep: Episode) -> float:
    return 0.25


class Hanging(Environment):
    name = "hanging"
    rewards = [WeightedReward(quick, 2.0), WeightedReward(hangs), WeightedReward(awaits_forever)]
    reward_timeout = 0.3


def test_a_reward_past_its_timeout_scores_zero_is_counted_and_the_others_score() -> None:
    scores = asyncio.run(Hanging().score(Episode({}, [])))
    assert scores == {"quick": 0.25, "hangs": 0.0, "awaits_forever": 0.0, "reward": 0.5, "reward_errors": 2}
    assert reward_calls.oldest() is None  # nothing counts as running once abandoned
    assert reward_calls.abandoned_still_running() >= 1  # the sync call's thread, idle until exit


def test_a_hung_reward_holds_neither_the_loop_nor_the_other_episodes() -> None:
    async def run() -> tuple[float, dict[str, float]]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        start = time.monotonic()
        scores = await asyncio.gather(*(Hanging().score(Episode({}, [])) for _ in range(8)))
        ticker.cancel()
        assert ticks > 10  # the loop ran while every reward hung
        return time.monotonic() - start, scores[0]

    seconds, scores = asyncio.run(run())
    assert seconds < 3  # eight episodes scored side by side, each within its bound
    assert scores["reward_errors"] == 2


def test_the_running_call_is_named_with_its_age() -> None:
    async def run() -> tuple[str, float] | None:
        task = asyncio.create_task(Hanging().score(Episode({}, [])))
        await asyncio.sleep(0.2)
        seen = reward_calls.oldest()
        await task
        return seen

    seen = asyncio.run(run())
    assert seen is not None and seen[0] == "reward hangs of hanging" and 0.1 < seen[1] < 0.3


@pytest.mark.parametrize("error", ["SystemExit(3)", "KeyboardInterrupt()"])
def test_a_reward_raising_a_base_exception_is_an_error_not_an_exit(error: str) -> None:
    def exits(ep: Episode) -> float:
        raise eval(error)

    env = Hanging()
    env.rewards = [WeightedReward(exits)]
    assert asyncio.run(env.score(Episode({}, [])))["reward_errors"] == 1


@pytest.mark.slow
def test_a_process_whose_reward_never_returns_exits_after_scoring() -> None:
    script = textwrap.dedent(
        """
        import asyncio, time
        from lorarl.orchestrator.envs.base import Episode
        from tests.unit.orchestrator.test_reward_calls import Hanging
        print(asyncio.run(Hanging().score(Episode({}, [])))["reward_errors"])
        """
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[3]
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert time.monotonic() - start < 30  # the hung call's thread did not hold the exit
