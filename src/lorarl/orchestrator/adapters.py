"""`AdapterWatcher`: follows broadcasts/ and keeps the newest adapter loaded on every worker."""

from __future__ import annotations

import asyncio
import logging
import time

from lorarl.inference.client import WorkerPool
from lorarl.run_folder import RunFolder

log = logging.getLogger("lorarl.orchestrator")


class AdapterWatcher:
    """Each policy version N is loaded under its own name, `<run_name>-step<N>`, so requests in
    flight keep the version that started them and two runs can share one inference fleet.

    Call `refresh` / `wait_for` only between batches, when no request is in flight: the previous
    version is unloaded as soon as a newer one is loaded.
    """

    def __init__(self, pool: WorkerPool, run: RunFolder, run_name: str) -> None:
        self.pool, self.run, self.run_name = pool, run, run_name
        self.version: int | None = None

    @property
    def name(self) -> str:
        assert self.version is not None, "no adapter loaded yet"
        return self.adapter_name(self.version)

    def adapter_name(self, version: int) -> str:
        return f"{self.run_name}-step{version}"

    async def refresh(self) -> bool:
        """Load the newest complete broadcast if it is newer than the current one."""
        latest = self.run.latest_stable_broadcast()
        if latest is None or (self.version is not None and latest <= self.version):
            return False
        await self.pool.load_adapter(self.adapter_name(latest), str(self.run.broadcast(latest).resolve()))
        previous, self.version = self.version, latest
        if previous is not None:
            await self.pool.unload_adapter(self.adapter_name(previous))
        log.info("policy version %d loaded as %s", latest, self.name)
        return True

    async def wait_for(self, min_version: int, timeout: float, poll: float = 0.05) -> float:
        """Refresh until the loaded version is at least `min_version`; returns seconds waited."""
        start = time.monotonic()
        await self.refresh()
        while self.version is None or self.version < min_version:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"no adapter version >= {min_version} in {self.run.root / 'broadcasts'} "
                                   f"after {timeout:.0f} s (is the trainer alive?)")  # fmt: skip
            await asyncio.sleep(poll)
            await self.refresh()
        return time.monotonic() - start
