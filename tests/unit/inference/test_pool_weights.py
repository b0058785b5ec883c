"""Full fine-tuning's weights on a worker that comes back: it reloads the newest version, also one
that the trainer wrote while it was loading the last."""

from __future__ import annotations

import asyncio

from lorarl.inference.pool import WorkerPool


def test_a_returning_worker_reloads_until_it_has_the_newest_weights() -> None:
    pool = WorkerPool(["http://127.0.0.1:1"])
    worker = pool.workers[0]
    loaded: list[str] = []

    async def reload_weights(path: str) -> None:
        loaded.append(path)
        if path == "broadcasts/step_4":
            pool.weights = "broadcasts/step_5"  # the orchestrator moved on while this worker loaded

    worker.reload_weights = reload_weights  # type: ignore[method-assign]
    pool.weights = "broadcasts/step_4"
    asyncio.run(pool._sync_weights(worker))
    assert loaded == ["broadcasts/step_4", "broadcasts/step_5"]
