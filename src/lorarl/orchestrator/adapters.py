"""`AdapterWatcher`: follows broadcasts/ and keeps the newest adapter loaded on every worker."""

from __future__ import annotations

import logging
import shutil
import time
from collections import Counter
from pathlib import Path

from lorarl.inference.pool import WorkerPool
from lorarl.run_folder import RunFolder

log = logging.getLogger("lorarl.orchestrator")


class AdapterWatcher:
    """Each policy version N is loaded under its own name, `<run_name>-step<N>`, so requests in
    flight keep the version that started them, vLLM's same-name reload problems never apply, and
    two runs can share one inference fleet.

    New work takes the newest version with `acquire` and gives it back with `release`; an older
    version is unloaded once no work holds it.
    """

    def __init__(self, pool: WorkerPool, run: RunFolder, run_name: str, delete_unloaded: bool = False) -> None:
        # run_name: the adapter names' prefix; a variant's is `<run_name>-<variant>` (orchestrator.py).
        self.pool, self.run, self.run_name = pool, run, run_name
        # Disk hygiene: an adapter folder nothing will load again goes (checkpoints keep their own).
        self.delete_unloaded = delete_unloaded
        self.version: int | None = None
        self._loaded: set[int] = set()
        self._in_use: Counter[int] = Counter()
        # Seconds from each loaded version's optimizer step to it being live on every worker, since
        # the last `take_live_latencies` (versions without an optimizer step are not counted).
        self._live_s: list[float] = []

    def adapter_name(self, version: int) -> str:
        return f"{self.run_name}-step{version}"

    async def remove_leftovers(self) -> None:
        """Unload the adapters of this run name that the workers still serve (from a run of the same
        name that ended, or this run before a resume), so that they hold no adapter slots. Those of
        a run of the same name that is still going, in another folder, are its own: refuse to start."""
        for worker in self.pool.workers:
            for model in await worker.models():
                name, root = model["id"], model.get("root")
                if not (model.get("parent") and name.startswith(f"{self.run_name}-step") and root):
                    continue
                # broadcasts/step_N, or a variant's broadcasts/<variant>/step_N -> its run folder
                owner = RunFolder(Path(root).parents[1 if self.run.variant is None else 2])
                if owner.root.resolve() != self.run.root.resolve() and owner.is_alive():
                    raise RuntimeError(
                        f"{worker.base_url} serves {name} for the run in {owner.root}, which is still going: "
                        "give this run another run_name"
                    )
                log.info("unloading %s, left on %s by an earlier run of this name", name, worker.base_url)
                await worker.unload_adapter(name)

    async def refresh(self) -> bool:
        """Load the newest complete broadcast if it is newer than the current one."""
        latest = self.run.latest_stable_broadcast()
        if latest is None or (self.version is not None and latest <= self.version):
            return False
        await self.pool.load_adapter(self.adapter_name(latest), str(self.run.broadcast(latest).resolve()))
        if (updated_at := self.run.broadcast_updated_at(latest)) is not None:
            self._live_s.append(time.time() - updated_at)
        skipped = range(self.version + 1, latest) if self.version is not None else range(0)
        self.version = latest
        self._loaded.add(latest)
        log.info("policy version %d loaded as %s", latest, self.adapter_name(latest))
        await self._unload_unused()
        if self.delete_unloaded:  # versions the trainer wrote faster than they were loaded: never will be
            for version in skipped:
                shutil.rmtree(self.run.broadcast(version), ignore_errors=True)
        return True

    def take_live_latencies(self) -> list[float]:
        """The hand-off latencies (see `_live_s`) of the versions loaded since the last call."""
        taken, self._live_s = self._live_s, []
        return taken

    def acquire(self) -> tuple[int, str]:
        """The newest loaded version and its adapter name, held until `release`."""
        assert self.version is not None, "no adapter loaded yet"
        self._in_use[self.version] += 1
        return self.version, self.adapter_name(self.version)

    async def release(self, version: int) -> None:
        self._in_use[version] -= 1
        await self._unload_unused()

    async def _unload_unused(self) -> None:
        for version in sorted(self._loaded):
            if version != self.version and self._in_use[version] == 0:
                self._loaded.discard(version)
                del self._in_use[version]
                await self.pool.unload_adapter(self.adapter_name(version))
                if self.delete_unloaded:
                    shutil.rmtree(self.run.broadcast(version), ignore_errors=True)
