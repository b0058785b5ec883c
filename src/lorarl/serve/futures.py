"""Waiting for a request's result: the SDK asks for it (`retrieve_future`) right after submitting, and
again at once after every "try again", so an answer must be held until the result is there or
`serve.long_poll` seconds have passed (an instant "try again" would make the SDK spin). The results
themselves are in the store; this keeps only the wake-up of every waiter of a request, in memory.
"""

from __future__ import annotations

import asyncio
import contextlib


class Waiters:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    async def wait(self, request_id: str, timeout: float) -> None:
        """Return when `finished(request_id)` is called, or after `timeout` seconds."""
        event = self._events.setdefault(request_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def finished(self, request_id: str) -> None:
        if (event := self._events.pop(request_id, None)) is not None:
            event.set()
