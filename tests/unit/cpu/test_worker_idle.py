"""The vLLM CPU worker's short busy loop (cpu/worker_idle.py), on vLLM's own SpinCondition."""

from __future__ import annotations

import time
from types import SimpleNamespace

from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

from lorarl.cpu import lora_ops, worker_idle


def test_the_worker_extension_installs_it_and_waits_spin_briefly() -> None:
    assert lora_ops.worker_idle is worker_idle  # importing the extension installed it (this is a CPU)
    assert getattr(SpinCondition.wait, "lorarl", False)
    worker_idle.install()  # twice: still one wrapper
    assert getattr(SpinCondition.wait, "lorarl", False)
    # A reader built before the patch (busy_loop_s = 1, read just now) yields once and returns...
    reader = SimpleNamespace(is_reader=True, busy_loop_s=1.0, last_read=time.monotonic())
    SpinCondition.wait(reader, 0)  # type: ignore[arg-type]
    assert reader.busy_loop_s == worker_idle.BUSY_LOOP_S
    # ... and past BUSY_LOOP_S it sleeps on its socket instead of spinning (vLLM's idle path).
    polled = []
    reader.last_read -= 1
    reader.poller = SimpleNamespace(poll=lambda timeout: polled.append(timeout) or [])
    reader.read_cancel_socket = reader.local_notify_socket = object()
    SpinCondition.wait(reader, 7)  # type: ignore[arg-type]
    assert polled == [7]
