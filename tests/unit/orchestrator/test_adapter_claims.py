"""Two runs of one run_name on one server: a run that finds any adapter of its name served for a run
still going stops in one line, before it loads (loading a version also claims its name there, for
two that start together); one left by a run that ended is replaced. (Against a loopback vLLM stand-in.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lorarl.inference.pool import WorkerPool
from lorarl.orchestrator.adapters import AdapterNameInUse, AdapterWatcher
from lorarl.run_folder import RunFolder, write_folder_atomically
from tests.unit.inference.fake_vllm import FakeVLLM


def run_with_adapter(root: Path) -> RunFolder:
    run = RunFolder(root)
    run.prepare("rl", {}, resume=False, overwrite=False)
    write_folder_atomically(run.broadcast(0), lambda d: None, stable_marker=True)
    return run


async def refresh(url: str, run: RunFolder) -> None:
    pool = WorkerPool([url])
    try:
        await AdapterWatcher(pool, run, "exp").refresh()
    finally:
        await pool.close()


def test_a_name_claimed_by_a_live_run_of_the_same_name_is_refused(tmp_path: Path) -> None:
    ours, live = run_with_adapter(tmp_path / "a" / "exp"), run_with_adapter(tmp_path / "b" / "exp")
    live.hold_lock()  # its rl is running
    with FakeVLLM() as server:
        # It loaded step 0 after this run looked for leftovers (remove_leftovers): both started together.
        server.adapters["exp-step0"] = str(live.broadcast(0).resolve())
        with pytest.raises(AdapterNameInUse, match=f"serves exp-step0 for the run in {live.root.resolve()}, which is "
                                               "still going: give this run another run_name"):  # fmt: skip
            asyncio.run(refresh(server.url, ours))
        assert server.adapters == {"exp-step0": str(live.broadcast(0).resolve())}  # its policy untouched


def test_a_run_refuses_to_load_beside_another_version_of_its_name_that_a_live_run_serves(tmp_path: Path) -> None:
    """The live run has moved on to step 1 and unloaded its step 0: this run must not take the free
    name `exp-step0`, which would put two runs' policies under one name in turn (CI's race)."""
    ours, live = run_with_adapter(tmp_path / "a" / "exp"), run_with_adapter(tmp_path / "b" / "exp")
    live.hold_lock()
    with FakeVLLM() as server:
        server.adapters["exp-step1"] = str(live.broadcast(1).resolve())
        with pytest.raises(AdapterNameInUse, match="serves exp-step1 for the run in .*, which is still going"):
            asyncio.run(refresh(server.url, ours))
        assert server.adapters == {"exp-step1": str(live.broadcast(1).resolve())}


def test_a_name_left_by_an_ended_run_is_replaced(tmp_path: Path) -> None:
    ours, ended = run_with_adapter(tmp_path / "a" / "exp"), run_with_adapter(tmp_path / "b" / "exp")
    with FakeVLLM() as server:
        server.adapters["exp-step0"] = str(ended.broadcast(0).resolve())
        asyncio.run(refresh(server.url, ours))
        assert server.adapters == {"exp-step0": str(ours.broadcast(0).resolve())}


def test_a_frozen_worker_is_routed_around_by_the_check_not_waited_on(tmp_path: Path) -> None:
    """The check before each load asks every routable worker what it serves: one that does not answer
    is taken out of routing, as by any other request, and the version loads on the others (an
    integration run crashed on WorkerStalled when the check asked every worker)."""
    ours = run_with_adapter(tmp_path / "exp")

    async def load() -> list[str]:
        pool = WorkerPool([healthy.url, frozen.url], timeout=0.5)
        try:
            await AdapterWatcher(pool, ours, "exp").refresh()
            return [w.base_url for w in pool.routable]
        finally:
            await pool.close()

    with FakeVLLM() as healthy, FakeVLLM() as frozen:
        frozen.frozen.set()
        assert asyncio.run(load()) == [healthy.url]
        assert healthy.adapters == {"exp-step0": str(ours.broadcast(0).resolve())}
