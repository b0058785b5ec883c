"""serve/futures.Waiters: a retrieve_future waiter wakes when its request finishes, and no later than
its long poll when it does not (the server then answers 408 "try again", which the SDK repeats)."""

from __future__ import annotations

import asyncio
import time

from lorarl.serve.futures import Waiters


def test_waiter_wakes_when_its_request_finishes() -> None:
    async def scenario() -> float:
        waiters = Waiters()
        start = time.monotonic()
        waiting = asyncio.create_task(waiters.wait("req-1", timeout=30))
        await asyncio.sleep(0.05)
        waiters.finished("req-1")
        await waiting
        return time.monotonic() - start

    assert asyncio.run(scenario()) < 5


def test_waiter_gives_up_after_its_long_poll() -> None:
    async def scenario() -> tuple[float, bool]:
        waiters = Waiters()
        start = time.monotonic()
        other = asyncio.create_task(waiters.wait("req-2", timeout=30))
        await waiters.wait("req-1", timeout=0.2)  # nothing finishes req-1
        elapsed = time.monotonic() - start
        still_waiting = not other.done()
        waiters.finished("req-2")
        await other
        return elapsed, still_waiting

    elapsed, other_still_waiting = asyncio.run(scenario())
    assert 0.2 <= elapsed < 5
    assert other_still_waiting  # one request's time-out wakes no other waiter


def test_every_waiter_of_a_request_wakes() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        both = asyncio.gather(waiters.wait("req-1", timeout=30), waiters.wait("req-1", timeout=30))
        await asyncio.sleep(0.05)
        waiters.finished("req-1")
        await asyncio.wait_for(both, 5)

    asyncio.run(scenario())


def test_finishing_a_request_nobody_waits_for_is_harmless() -> None:
    Waiters().finished("never-asked")
