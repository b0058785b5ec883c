"""The trainer's host memory on a CPU: freed tensors go back to the system.

glibc's malloc serves allocations below its mmap threshold from its heap, and raises that threshold
(up to 32 MiB) each time a large block is freed, so the activations of one step (tensors of 1-30 MiB
at real shapes) end up in the heap, where freed blocks stay resident. Measured on the Qwen3-0.6B
shape (float32, LoRA rank 8, four 640-token rows): the trainer's resident peak was 8.1 GiB in process
(11.8 GiB over an `rl` run) for 4.5 GiB of live tensors, the memory plan's figure; with a fixed
threshold of 128 KiB every freed tensor is unmapped, and the peak is 4.96 GiB (docs/real_shapes.md).
A GPU keeps its tensors on the device, so there the setting is left alone.
"""

from __future__ import annotations

import ctypes
import logging

import torch

log = logging.getLogger("lorarl.trainer")

M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>
MMAP_THRESHOLD_BYTES = 128 * 1024


def return_freed_tensors_to_system(device: torch.device) -> None:
    """On the CPU with glibc: allocations of 128 KiB or more are mmapped, so freeing one unmaps it."""
    if device.type != "cpu":
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc; absent from macOS's libc
    if mallopt is None or mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
        log.debug("malloc's mmap threshold left as it is (not glibc)")
