"""`WorkerPool`: all inference workers of a run, kept usable while some of them fail.

Requests go to the routable worker with the fewest in flight. A worker that fails a request
(`WorkerUnavailable`: down, restarting, timing out, HTTP 5xx) is taken out of routing and the
request is sent again elsewhere, or to the same worker once it is back. A worker out of routing is
watched until /health answers again (after `rl` restarted it, say); it then gets every adapter
version still in use and is put back. Only when no worker has been routable for
`unavailable_timeout` seconds does a request fail, which stops the orchestrator.

A worker that stops answering without failing (frozen, swapping) is found by the requests' timeouts
(client.py: they follow the tokens asked for), or sooner by a watchdog that asks every routable
worker for /health every few seconds and gives it the requests' fixed timeout to answer (a long
generation does not delay that). A stalled worker is counted in `stalls`, and the requests it holds
are abandoned and sent elsewhere at once. Each outage is logged when it starts and, with its length,
when it ends, so that even a short freeze leaves a trace.
Adapters on a shared server that this pool did not load are never unloaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from lorarl.inference.client import Completion, InferenceClient, InferenceError, WorkerStalled, WorkerUnavailable
from lorarl.inference.health import health_problem, is_healthy

log = logging.getLogger("lorarl.inference")
T = TypeVar("T")


class AdapterCheck(Protocol):
    """What the pool runs on a worker after it loads an adapter (orchestrator/served_check.py)."""

    async def __call__(self, worker: InferenceClient, name: str, path: str) -> None: ...

    def flush(self) -> None:
        """The adapter is loaded on every routable worker: log its checks."""


class InferenceUnavailable(RuntimeError):
    """No worker could serve a request for `unavailable_timeout` seconds."""


class WorkerPool:
    def __init__(
        self,
        urls: list[str],
        api_key: str | None = None,
        timeout: float = 600.0,
        unavailable_timeout: float = 300.0,
        poll: float = 0.5,
        run_dirs: list[tuple[str, str]] | None = None,
        tokens_per_s: float | None = None,
    ) -> None:
        """`run_dirs`: for each worker, (the run folder here, the same on its machine), if they differ;
        `timeout` and `tokens_per_s`: each request's timeout (InferenceClient)."""
        if not urls:
            raise ValueError("no inference worker URLs")
        dirs: list[tuple[str, str] | None] = list(run_dirs) if run_dirs else [None] * len(urls)
        self.workers = [
            InferenceClient(u, timeout, api_key=api_key, run_dirs=d, tokens_per_s=tokens_per_s)
            for u, d in zip(urls, dirs, strict=True)
        ]
        self.routable = list(self.workers)
        self.unavailable_timeout, self.poll = unavailable_timeout, poll
        # Every adapter the run has loaded and not unloaded: name -> folder. A returning worker gets them all.
        self.adapters: dict[str, str] = {}
        # Full fine-tuning: the model folder every worker serves (None: the base model); a returning worker reloads it.
        self.weights: str | None = None
        self._watchers: dict[InferenceClient, asyncio.Task[None]] = {}
        # Set while a worker is out of routing for a stall: the requests it holds are abandoned.
        self._stalled = {w: asyncio.Event() for w in self.workers}
        self._routed = dict.fromkeys(self.workers, 0)  # requests routed to each worker and not yet answered
        self._watchdog: asyncio.Task[None] | None = None  # started with the first request (it needs the loop)
        self.probe_every = 10 * poll  # seconds between the watchdog's rounds of /health
        self.outages = 0  # workers taken out of routing so far
        self.stalls = 0  # of which for not answering in time (WorkerStalled)
        # Run on a worker after it loads an adapter, before it serves it: (worker, name, folder).
        self.served_check: AdapterCheck | None = None
        # Adapter name -> workers its rollouts avoid (a failed served-adapter check with "warn").
        self.excluded: dict[str, set[InferenceClient]] = {}

    def busy_seconds(self) -> float:
        """Busy time summed over workers, including requests still running."""
        now = time.monotonic()
        return sum(w.busy_seconds + (now - w._busy_since if w.in_flight else 0.0) for w in self.workers)

    async def complete(self, model: str, prompt_ids: list[int], n: int, **sampling: Any) -> list[Completion]:
        return await self.route(lambda worker: worker.complete(model, prompt_ids, n, **sampling), model)

    async def chat(self, model: str, messages: list[dict[str, str]], **params: Any) -> str:
        return await self.route(lambda worker: worker.chat(model, messages, **params))

    async def route(self, call: Callable[[InferenceClient], Awaitable[T]], model: str | None = None) -> T:
        """`call` on the least busy routable worker (of those not excluded for `model`), again
        elsewhere while workers fail."""
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch())
        deadline = time.monotonic() + self.unavailable_timeout
        while True:
            worker = await self._pick(deadline, model)
            # Counted here, not by the client: the request starts only when the loop runs it, after the
            # picks of the requests gathered with it, which would otherwise all see the same counts.
            self._routed[worker] += 1
            try:
                return await self._unless_stalled(worker, call(worker))
            except WorkerUnavailable as e:
                self._take_out(worker, e)
            finally:
                self._routed[worker] -= 1

    async def _unless_stalled(self, worker: InferenceClient, request: Awaitable[T]) -> T:
        """The answer to `request` on `worker`; WorkerUnavailable if the worker is found stalled first
        (by another request or the watchdog): its request is cancelled, to be sent elsewhere."""
        answer = asyncio.ensure_future(request)
        stalled = asyncio.ensure_future(self._stalled[worker].wait())
        try:
            await asyncio.wait({answer, stalled}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when this is cancelled: neither outlives it
            stalled.cancel()
            abandoned = not answer.done()
            if abandoned:
                answer.cancel()
        if abandoned:
            raise WorkerUnavailable(f"{worker.base_url} stalled while this request ran")
        return answer.result()

    async def _watch(self) -> None:
        """Every probe_every seconds, each routable worker's /health, in parallel: one that does not
        answer within the requests' fixed timeout is stalled (or down) and leaves routing."""
        while True:
            await asyncio.sleep(self.probe_every)
            workers = list(self.routable)
            probes = (asyncio.to_thread(health_problem, w.base_url, w.timeout) for w in workers)
            for worker, problem in zip(workers, await asyncio.gather(*probes), strict=True):
                if problem is not None:
                    kind = WorkerStalled if isinstance(problem, TimeoutError) else WorkerUnavailable
                    self._take_out(worker, kind(f"GET {worker.base_url}/health: {problem!r}"))

    async def load_adapter(self, name: str, path: str, replace: bool = False) -> None:
        """Load into every routable worker; the others get it when they return. `replace`: see
        InferenceClient.load_adapter (AdapterNameTaken)."""
        self.adapters[name] = path
        await self._on_routable(lambda w: self._load(w, name, path, replace))
        if self.served_check is not None:
            self.served_check.flush()

    async def _load(self, worker: InferenceClient, name: str, path: str, replace: bool = False) -> None:
        """Load the adapter into `worker`, then check what it serves (served_check)."""
        await worker.load_adapter(name, path, replace)
        if self.served_check is not None:
            await self.served_check(worker, name, path)

    async def served(self) -> list[tuple[InferenceClient, list[dict[str, Any]]]]:
        """What each routable worker serves (GET /v1/models); one that does not answer is taken out of
        routing, as by any other call, and left out."""
        found: list[tuple[InferenceClient, list[dict[str, Any]]]] = []

        async def ask(worker: InferenceClient) -> None:
            found.append((worker, await worker.models()))

        await self._on_routable(ask)
        return found

    def exclude(self, worker: InferenceClient, name: str) -> None:
        """Send no more requests for adapter `name` to `worker` while others can take them."""
        self.excluded.setdefault(name, set()).add(worker)

    async def reload_weights(self, path: str) -> None:
        """Full fine-tuning: every routable worker serves the model folder `path` from now on; the
        others reload it when they return."""
        self.weights = path
        await self._on_routable(lambda w: w.reload_weights(path))

    async def unload_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)
        self.excluded.pop(name, None)
        await self._on_routable(lambda w: w.unload_adapter(name))

    async def close(self) -> None:
        tasks = [*self._watchers.values(), *([self._watchdog] if self._watchdog else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(w.close() for w in self.workers))

    async def _on_routable(self, call: Any) -> None:
        workers = list(self.routable)
        results = await asyncio.gather(*(call(w) for w in workers), return_exceptions=True)
        for worker, result in zip(workers, results, strict=True):
            if isinstance(result, WorkerUnavailable):
                self._take_out(worker, result)
            elif isinstance(result, BaseException):
                raise result

    async def _pick(self, deadline: float, model: str | None = None) -> InferenceClient:
        while not self.routable:
            if time.monotonic() > deadline:
                raise InferenceUnavailable(
                    f"no inference worker answered for {self.unavailable_timeout:.0f} s "
                    f"({', '.join(w.base_url for w in self.workers)}; inference.unavailable_timeout)"
                )
            await asyncio.sleep(self.poll)
        excluded = self.excluded.get(model or "", set())
        # Every worker excluded ("warn" failed on all): the run goes on with them, as "warn" asks.
        candidates = [w for w in self.routable if w not in excluded] or self.routable
        return min(candidates, key=lambda w: self._routed[w])

    def _take_out(self, worker: InferenceClient, error: Exception) -> None:
        if worker not in self.routable:
            return
        self.routable.remove(worker)
        self.outages += 1
        if isinstance(error, WorkerStalled):
            self.stalls += 1
            self._stalled[worker].set()
            log.warning(
                "%s stalled, taking it out of routing (%d of %d worker(s) left): %s",
                worker.base_url,
                len(self.routable),
                len(self.workers),
                error,
            )
        else:
            log.warning("taking %s out of routing: %s", worker.base_url, error)
        self._watchers[worker] = asyncio.create_task(self._bring_back(worker, time.monotonic()))

    async def _bring_back(self, worker: InferenceClient, since: float) -> None:
        """Wait until the worker is healthy, give it the adapters in use, and route to it again."""
        while True:
            while not await asyncio.to_thread(is_healthy, worker.base_url):
                await asyncio.sleep(self.poll)
            try:
                # What the server really serves of ours: after a restart, none. Other runs' adapters
                # on a shared server are theirs, never unloaded here.
                served = {m["id"] for m in await worker.models() if m.get("parent")}
                worker.adapters &= served
                await self._sync_adapters(worker)
                if self.weights is not None:  # a restarted worker serves the base model again
                    await self._sync_weights(worker)
            except WorkerUnavailable:
                continue
            except InferenceError as e:  # refused for good (another run's adapter of our name): no way back
                log.error("%s stays out of routing: %s", worker.base_url, e)
                return
            self._stalled[worker].clear()
            self.routable.append(worker)
            del self._watchers[worker]
            log.info(
                "%s is back in routing after %.1f s out, with %d adapter(s)",
                worker.base_url,
                time.monotonic() - since,
                len(worker.adapters),
            )
            return

    async def _sync_adapters(self, worker: InferenceClient) -> None:
        """Make the worker serve exactly the pool's adapters. Versions may load and unload while
        this awaits, so it repeats until nothing differs; the caller then routes to the worker
        without awaiting in between."""
        while (stale := worker.adapters - self.adapters.keys()) | (missing := self.adapters.keys() - worker.adapters):
            for name in stale:
                await worker.unload_adapter(name)
            for name in missing:
                if (path := self.adapters.get(name)) is not None:
                    await self._load(worker, name, path)

    async def _sync_weights(self, worker: InferenceClient) -> None:
        """Reload the pool's weights into the worker until they stay the newest while it loads them."""
        loaded = None
        while loaded != self.weights:
            loaded = self.weights
            assert loaded is not None
            await worker.reload_weights(loaded)
