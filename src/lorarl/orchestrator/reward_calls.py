"""Reward calls bounded in time, abandoned past their bound, and visible while they run.

A reward function is the user's code, and may never return (a deadlock, a sandbox or a service
that hangs, a loop that never ends). Each call runs in a daemon thread of its own and is awaited
for at most `orchestrator.reward_timeout` seconds; past that it raises `RewardTimeout`, which
`Environment.score` scores 0 and counts in `reward_errors` like a reward that raises, and the call
is abandoned. Why a daemon thread: neither the event loop (every episode, every request) nor the
process's exit ever waits on it. The threads of a ThreadPoolExecutor, and so asyncio.to_thread's,
are joined when the process exits (and asyncio.run joins its default executor), so one hung call
would keep the orchestrator alive forever after its last step. A process per call could be killed
where a thread can only be left to run on (idle or busy) until the process exits, but it would
need every reward function and episode to pickle, and a fork or a spawn per call.
An `async def` reward (a judge) only makes its coroutine in the thread; the coroutine is awaited on
the loop within the same bound, and cancelled past it. One that blocks the loop (a `time.sleep` in
an `async def`) cannot be bounded here: the run's watchdog (monitor.stall_warning) names it stalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any


class RewardTimeout(TimeoutError):
    """A reward call that ran past its bound; it was abandoned."""


# Calls running now: call id -> (what, when it started by time.monotonic()). Read by `oldest`.
_running: dict[int, tuple[str, float]] = {}
_ids = itertools.count()
# Threads of calls abandoned past their bound that still run (idle or busy) in this process.
_abandoned: set[threading.Thread] = set()


async def call_bounded(func: Callable[[Any], Any], arg: Any, timeout: float, what: str) -> Any:
    """`func(arg)`, awaited if it returns an awaitable, within `timeout` seconds in all; `what` names
    the call while it runs (`oldest`). Raises what the call raised, or RewardTimeout."""
    call, loop = next(_ids), asyncio.get_running_loop()
    _running[call] = (what, time.monotonic())
    answer: asyncio.Future[Any] = loop.create_future()
    thread = threading.Thread(target=_run, args=(func, arg, loop, answer), name=what, daemon=True)
    try:
        async with asyncio.timeout(timeout):
            thread.start()
            value = await answer
            return await value if inspect.isawaitable(value) else value
    except TimeoutError:
        if thread.is_alive():
            _abandoned.add(thread)
        raise RewardTimeout(f"no score within {timeout:g} s") from None
    finally:
        del _running[call]


def _run(func: Callable[[Any], Any], arg: Any, loop: asyncio.AbstractEventLoop, answer: asyncio.Future[Any]) -> None:
    """In the call's thread: `func(arg)`, handed to `answer` on the loop (if anyone still waits)."""
    try:
        value, error = func(arg), None
    except Exception as e:
        value, error = None, e
    except BaseException as e:  # SystemExit, KeyboardInterrupt raised by the function: it failed, no more
        value, error = None, RuntimeError(f"raised {e!r}")
    with contextlib.suppress(RuntimeError):  # the loop is closed: the call was abandoned, the run has ended
        loop.call_soon_threadsafe(_settle, answer, value, error)


def _settle(answer: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if answer.done():  # abandoned past its bound: nobody waits
        if inspect.iscoroutine(value):
            value.close()  # never to be awaited: closed, without a "never awaited" warning
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(value)


def oldest() -> tuple[str, float] | None:
    """The call running longest: (what, seconds so far), or None when none runs."""
    if not _running:
        return None
    what, started = min(_running.values(), key=lambda v: v[1])
    return what, time.monotonic() - started


def abandoned_still_running() -> int:
    """How many abandoned calls still run in this process (each holds a thread until it returns)."""
    _abandoned.difference_update([t for t in _abandoned if not t.is_alive()])
    return len(_abandoned)
