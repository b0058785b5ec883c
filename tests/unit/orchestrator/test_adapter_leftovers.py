"""`AdapterWatcher.remove_leftovers`: adapters of this run's name left on a server are unloaded,
unless they belong to a run of the same name, in another folder, that is still going."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lorarl.orchestrator.adapters import AdapterNameInUse, AdapterWatcher
from lorarl.run_folder import RunFolder


class Worker:
    """A stand-in for one vLLM server's adapter list (`InferenceClient.models` / `unload_adapter`)."""

    base_url = "http://127.0.0.1:1"

    def __init__(self, adapters: dict[str, Path]) -> None:
        self.adapters = adapters

    async def models(self) -> list[dict[str, Any]]:
        return [{"id": "base", "root": "/m", "parent": None}] + [
            {"id": name, "root": str(root), "parent": "base"} for name, root in self.adapters.items()
        ]

    async def unload_adapter(self, name: str) -> None:
        del self.adapters[name]


class Pool:
    """`WorkerPool.served` over one worker."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def served(self) -> list[tuple[Worker, list[dict[str, Any]]]]:
        return [(self.worker, await self.worker.models())]


def run_folder(root: Path) -> RunFolder:
    run = RunFolder(root)
    run.prepare("rl", {}, resume=False, overwrite=False)
    return run


def test_leftovers_of_this_name_are_unloaded_others_kept(tmp_path: Path) -> None:
    ours, ended = run_folder(tmp_path / "a" / "exp"), run_folder(tmp_path / "b" / "exp")
    worker = Worker({"exp-step3": ended.broadcast(3), "exp-step1": ours.broadcast(1),
                     "other-step2": tmp_path / "c" / "other" / "broadcasts" / "step_2"})  # fmt: skip
    asyncio.run(AdapterWatcher(Pool(worker), ours, "exp").remove_leftovers())  # type: ignore[arg-type]
    assert list(worker.adapters) == ["other-step2"]


def test_the_adapters_of_a_live_run_of_the_same_name_are_refused(tmp_path: Path) -> None:
    ours, live = run_folder(tmp_path / "a" / "exp"), run_folder(tmp_path / "b" / "exp")
    live.hold_lock()  # its rl is running
    worker = Worker({"exp-step3": live.broadcast(3)})
    with pytest.raises(AdapterNameInUse, match=f"serves exp-step3 for the run in {live.root}, which is still going"):
        asyncio.run(AdapterWatcher(Pool(worker), ours, "exp").remove_leftovers())  # type: ignore[arg-type]
    assert list(worker.adapters) == ["exp-step3"]
