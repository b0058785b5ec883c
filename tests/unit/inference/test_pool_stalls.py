"""`WorkerPool` with one worker of two frozen: the other carries every request, the frozen one is out
of routing once a request times out (counted and logged), and comes back, with the adapters in use,
once it answers again. Adapters on a shared server that the pool did not load are left alone."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from lorarl.inference.pool import WorkerPool
from tests.unit.inference.fake_vllm import FakeVLLM


async def sample(pool: WorkerPool, requests: int) -> None:
    params = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 10}
    await asyncio.gather(*(pool.complete("exp-step0", [1, 2], 2, **params) for _ in range(requests)))


async def until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


def test_requests_sent_together_are_spread_over_the_workers() -> None:
    async def run(first: FakeVLLM, second: FakeVLLM) -> None:
        pool = WorkerPool([first.url, second.url], timeout=5.0, poll=0.05)
        try:
            await pool.load_adapter("exp-step0", "/runs/exp/broadcasts/step_0")
            await sample(pool, 8)
        finally:
            await pool.close()

    with FakeVLLM() as first, FakeVLLM() as second:
        asyncio.run(run(first, second))
        assert first.completions == second.completions == 4


def test_a_frozen_worker_is_routed_around_logged_and_put_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "lorarl.inference")

    async def run(healthy: FakeVLLM, frozen: FakeVLLM) -> None:
        # 0.3 s + 10 tokens at 100/s: a stall is noticed after 0.4 s
        pool = WorkerPool([frozen.url, healthy.url], timeout=0.3, tokens_per_s=100.0, poll=0.05)
        try:
            await pool.load_adapter("exp-step0", "/runs/exp/broadcasts/step_0")
            frozen.frozen.set()
            start = time.monotonic()
            await sample(pool, 6)
            assert time.monotonic() - start < 5  # not the 600 s of a fixed timeout
            assert pool.stalls == pool.outages == 1 and pool.routable == [pool.workers[1]]
            await pool.load_adapter("exp-step1", "/runs/exp/broadcasts/step_1")  # while it is out
            frozen.frozen.clear()
            await until(lambda: len(pool.routable) == 2)
            assert frozen.adapters == healthy.adapters == {
                "exp-step0": "/runs/exp/broadcasts/step_0", "exp-step1": "/runs/exp/broadcasts/step_1"
            }  # fmt: skip
        finally:
            await pool.close()

    with FakeVLLM() as healthy, FakeVLLM() as frozen:
        asyncio.run(run(healthy, frozen))
        assert healthy.completions >= 6  # every request answered, those that stalled sent again here
    log = caplog.text
    assert f"{frozen.url} stalled, taking it out of routing (1 of 2 worker(s) left)" in log
    assert f"{frozen.url} is back in routing after" in log


@pytest.mark.slow
def test_a_freeze_shorter_than_a_long_generations_timeout_is_found_by_the_watchdog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Requests allowed 1000 s (max_tokens at a slow floor) on a worker frozen for 2 s: the watchdog's
    /health gets the fixed 0.3 s, so the requests leave the frozen worker at once and the freeze is
    logged with its length."""
    caplog.set_level(logging.INFO, "lorarl.inference")

    async def run(healthy: FakeVLLM, frozen: FakeVLLM) -> float:
        pool = WorkerPool([frozen.url, healthy.url], timeout=0.3, tokens_per_s=0.01, poll=0.05)
        try:
            frozen.frozen.set()
            start = time.monotonic()
            await sample(pool, 4)
            took = time.monotonic() - start
            await asyncio.sleep(2)
            frozen.frozen.clear()
            await until(lambda: len(pool.routable) == 2)
            return took
        finally:
            await pool.close()

    with FakeVLLM() as healthy, FakeVLLM() as frozen:
        took = asyncio.run(run(healthy, frozen))
    assert took < 5, took
    assert (
        f"{frozen.url} stalled, taking it out of routing (1 of 2 worker(s) left): GET {frozen.url}/health"
        in caplog.text
    )
    assert f"{frozen.url} is back in routing after" in caplog.text


def test_a_returning_worker_keeps_the_adapters_of_other_runs() -> None:
    async def run(server: FakeVLLM) -> None:
        pool = WorkerPool([server.url], timeout=0.2, poll=0.05)
        try:
            await pool.load_adapter("exp-step0", "/runs/exp/broadcasts/step_0")
            server.adapters["other-step3"] = "/runs/other/broadcasts/step_3"  # another run shares the server
            await pool.unload_adapter("exp-step0")
            server.frozen.set()
            stalled = asyncio.create_task(sample(pool, 1))
            await until(lambda: pool.stalls == 1)
            server.frozen.clear()
            await stalled  # sent again once the worker is back
        finally:
            await pool.close()

    with FakeVLLM() as server:
        asyncio.run(run(server))
        assert server.adapters == {"other-step3": "/runs/other/broadcasts/step_3"}
