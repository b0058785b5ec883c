"""A vLLM CPU worker that stops spinning as soon as it is idle, so that the trainer gets its cores.

vLLM 0.32's worker waits for the engine's next call by busy-looping (`sched_yield`) for a whole second
after the last one (`SpinCondition.busy_loop_s` in `vllm.distributed.device_communicators.shm_broadcast`)
before it sleeps on a socket. When vLLM and the trainer take turns on the same cores
(inference.time_share), that second is the first second of every trainer step, on one of the trainer's
cores: an OpenMP thread that shares its core with a spinner holds up every op of the trainer, which
ran 1.8x slower for it on the quickstart (docs/performance.md). Between the steps of one generation the
engine calls again within milliseconds, so a short busy loop keeps vLLM's latency while generating.

The worker extension (cpu_lora.py, which vLLM imports in every CPU worker process) installs this.
"""

from __future__ import annotations

from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

BUSY_LOOP_S = 0.005  # seconds a worker keeps spinning after the engine's last call


def install() -> None:
    """Shorten the busy loop of every `SpinCondition`, those already built included (the worker's
    queue to the engine exists before vLLM imports the extension): `wait` is looked up at each call."""
    if getattr(SpinCondition.wait, "lorarl", False):
        return
    wait = SpinCondition.wait

    def short_wait(self: SpinCondition, timeout_ms: int | None = None) -> None:
        self.busy_loop_s = min(self.busy_loop_s, BUSY_LOOP_S)
        wait(self, timeout_ms)

    short_wait.lorarl = True  # type: ignore[attr-defined]
    SpinCondition.wait = short_wait  # type: ignore[method-assign]
