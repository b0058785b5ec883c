"""The order in which the trainer process works for its tenants. The SDK promises each training client
that its requests run in the order it sent them, so each tenant (model id) has a queue, filled as the
submits arrive (a chunked forward_backward's chunks may arrive in any order among themselves: their
gradients add up the same). The trainer does one thing at a time, and takes the tenants in turn, one
request each (round robin), so that a tenant with a long queue does not hold the others up for more than
one request at a time. Work for several tenants in one forward pass is not done: PEFT trains one active
adapter per pass (docs/serve.md measures what taking turns costs).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable

log = logging.getLogger("lorarl.serve")
Job = Callable[[], Awaitable[None]]


class TenantQueues:
    def __init__(self) -> None:
        self._queues: OrderedDict[str, deque[Job]] = OrderedDict()
        self._ready = asyncio.Event()

    def submit(self, tenant: str, job: Job) -> None:
        self._queues.setdefault(tenant, deque()).append(job)
        self._ready.set()

    def pending(self, tenant: str) -> int:
        return len(self._queues.get(tenant, ()))

    async def run(self) -> None:
        """Run jobs forever, one at a time, the tenants in turn. A job handles its own errors; one that
        raises anyway is logged and does not stop the others."""
        while True:
            await self._ready.wait()
            while self._queues:
                tenant, queue = next(iter(self._queues.items()))
                job = queue.popleft()
                # Round robin: this tenant goes to the back of the line, or out of it when done.
                del self._queues[tenant]
                if queue:
                    self._queues[tenant] = queue
                try:
                    await job()
                except Exception:
                    log.exception("a job of %s failed", tenant)
            self._ready.clear()
