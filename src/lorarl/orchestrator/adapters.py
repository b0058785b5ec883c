"""Policy watchers: follow broadcasts/ and keep the newest policy on every worker.

`AdapterWatcher` loads each LoRA version under a name of its own; `WeightsWatcher` (model.full_finetune)
reloads the whole model in place, so that the workers always serve one version, the newest.

Two runs of the same run_name (in two folders) never share a server at once: before each load a run
checks that no worker serves an adapter of its name for another run still going, and loading a name
claims it (vLLM refuses a second load of a served name, atomically), so the second of two runs that
start together is refused too. It stops with one line. (Replacing the other run's adapter, as lorarl
once did, made one run sample with the other's policy and the engine crash on the swap; checking only
the name being loaded let a run load a version the other had just unloaded.)
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

from lorarl.inference.client import AdapterNameTaken, InferenceClient
from lorarl.inference.pool import WorkerPool
from lorarl.run_folder import RunFolder
from lorarl.written_files import remove_folder

log = logging.getLogger("lorarl.orchestrator")


class AdapterNameInUse(Exception):
    """A worker serves this run's adapter name for another run that is still going; str() is one line."""


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
        for worker, name in await self._served_of_this_name():
            log.info("unloading %s, left on %s by an earlier run of this name", name, worker.base_url)
            await worker.unload_adapter(name)

    async def _served_of_this_name(self) -> list[tuple[InferenceClient, str]]:
        """(worker, adapter name) of every adapter of this run name the workers serve; raises
        AdapterNameInUse if one belongs to a run of another folder that is still going."""
        served = []
        for worker, models in await self.pool.served():  # a stalled worker is routed around, not asked
            for model in models:
                name, root = model["id"], model.get("root")
                if model.get("parent") and name.startswith(f"{self.run_name}-step") and root:
                    self._refuse_if_live(worker.base_url, name, root)
                    served.append((worker, name))
        return served

    def _refuse_if_live(self, url: str, name: str, root: str | None) -> None:
        """Raise if the adapter `name` that `url` serves, loaded from `root`, belongs to a run of
        another folder that is still going (or to no run folder lorarl can tell)."""
        owner = self._owner(root)
        if owner is None or (owner.root.resolve() != self.run.root.resolve() and owner.is_alive()):
            raise AdapterNameInUse(
                f"{url} serves {name} for the run in {owner.root if owner else root}, which is still going: "
                "give this run another run_name"
            )

    def _owner(self, root: str | None) -> RunFolder | None:
        """The run folder of an adapter loaded from `root`: broadcasts/step_N, or a variant's
        broadcasts/<variant>/step_N; None if `root` is not such a folder."""
        parents = Path(root).parents if root else []
        depth = 1 if self.run.variant is None else 2
        return RunFolder(parents[depth]) if len(parents) > depth else None

    async def refresh(self) -> bool:
        """Load the newest complete broadcast if it is newer than the current one."""
        latest = self.run.latest_stable_broadcast()
        if latest is None or (self.version is not None and latest <= self.version):
            return False
        await self._load(latest)
        if (updated_at := self.run.broadcast_updated_at(latest)) is not None:
            self._live_s.append(time.time() - updated_at)
        skipped = range(self.version + 1, latest) if self.version is not None else range(0)
        self.version = latest
        self._loaded.add(latest)
        log.info("policy version %d loaded as %s", latest, self.adapter_name(latest))
        await self._unload_unused()
        if self.delete_unloaded:  # versions the trainer wrote faster than they were loaded: never will be
            for version in skipped:
                remove_folder(self.run.broadcast(version))  # the files lorarl wrote in it
        return True

    async def _load(self, version: int) -> None:
        name, path = self.adapter_name(version), str(self.run.broadcast(version).resolve())
        await self._served_of_this_name()  # another run of this name has started since: refuse
        try:
            await self.pool.load_adapter(name, path)
        except AdapterNameTaken as e:  # claimed since remove_leftovers: by a live run (refused), or ended
            self._refuse_if_live(e.base_url, name, e.root)
            await self.pool.load_adapter(name, path, replace=True)

    async def _unload(self, version: int) -> None:
        await self.pool.unload_adapter(self.adapter_name(version))

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
                await self._unload(version)
                if self.delete_unloaded:
                    remove_folder(self.run.broadcast(version))


class WeightsWatcher(AdapterWatcher):
    """Full fine-tuning: version N is the whole model in broadcasts/step_N, which every worker reloads
    in place over version N-1 (WorkerPool.reload_weights). Requests go to the served model's name,
    `model_name`, whatever the version; one in flight when a version loads finishes on its weights.
    Its rollout keeps the version it started with (so policy lag is counted from there), and the
    logprobs of the tokens each version sampled, which the trainer's importance ratio uses."""

    def __init__(self, pool: WorkerPool, run: RunFolder, model_name: str, delete_unloaded: bool = False) -> None:
        super().__init__(pool, run, run_name="", delete_unloaded=delete_unloaded)  # no adapters to name
        self.model_name = model_name

    def adapter_name(self, version: int) -> str:
        return self.model_name  # the served model, vLLM's --model, whatever weights it has now

    async def remove_leftovers(self) -> None:
        """Nothing to remove: the first `refresh` replaces whatever weights a worker serves."""

    async def _load(self, version: int) -> None:
        await self.pool.reload_weights(str(self.run.broadcast(version).resolve()))

    async def _unload(self, version: int) -> None:
        """Nothing to unload: the workers hold the newest version only."""
