"""Host memory on a CPU: what glibc's malloc does with the tensors a trainer step or a vLLM step frees.

Each step allocates and frees the same activations again. Two policies (`keep_freed_memory`):

* keep (the default): blocks below 32 MiB (glibc's largest mmap threshold) come from the heap, which
  is not trimmed, so what one step frees the next one reuses instead of faulting it in again. A page
  fault is dear in a virtual machine: this 2-core one hands freed pages back to its host (the
  balloon's free page reporting), and the 24M-parameter benchmark's `rl` step took 15.9 s with every
  freed tensor unmapped against 8.4 s kept (docs/benchmarks.md). The resident size stays at the step's peak
  of small blocks plus the heap's fragments: `sft` at vocabulary 151,936 and seq_len 8192 peaked at
  1.64 GiB against 1.23 returned (docs/real_shapes.md).
* return: allocations of 128 KiB or more are mmapped, so freeing one unmaps it and the resident peak
  follows the live tensors, as the memory plan counts them. Measured on the Qwen3-0.6B shape (float32,
  LoRA rank 8, four 640-token rows): 4.96 GiB resident against 8.1 GiB with glibc's own dynamic
  threshold (docs/real_shapes.md), for page faults on every step.

GLIBC_TUNABLES with glibc.malloc settings in the environment win over both. A GPU keeps its tensors
on the device, so there malloc is left alone. vLLM's CPU workers get the same policy through their
environment (`malloc_tunables`), as their processes are vLLM's to start.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("lorarl")

# glibc's <malloc.h>
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 128 * 1024
# Kept: blocks below glibc's largest mmap threshold come from the heap, which is trimmed only when 2 GiB
# (mallopt's largest value) at its top are free. Larger blocks are still mapped: served from the heap
# too (M_MMAP_MAX 0), a row's [chunk, vocab] logits at vocabulary 151,936 (78 MiB, 64-byte aligned)
# never fit the hole the last one left, and `sft` at seq_len 8192 peaked at 10.2 GiB against 1.6.
KEEP = {M_MMAP_THRESHOLD: 32 * 2**20, M_TRIM_THRESHOLD: 2**31 - 1}
RETURN = {M_MMAP_THRESHOLD: MMAP_THRESHOLD_BYTES}
_TUNABLE_NAMES = {M_TRIM_THRESHOLD: "trim_threshold", M_MMAP_THRESHOLD: "mmap_threshold"}


def _user_set_malloc() -> bool:
    return "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def set_host_malloc(on_cpu: bool, keep_freed_memory: bool) -> None:
    """This process's policy, for tensors on the CPU, with glibc, unless GLIBC_TUNABLES sets malloc already."""
    if not on_cpu or _user_set_malloc():
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc; absent from macOS's libc
    settings = KEEP if keep_freed_memory else RETURN
    if mallopt is None or not all(mallopt(k, v) == 1 for k, v in settings.items()):
        log.debug("malloc left as it is (not glibc)")


def malloc_tunables(keep_freed_memory: bool) -> dict[str, str]:
    """The same policy for a process about to start, as GLIBC_TUNABLES in its environment ({} where the
    environment sets malloc already)."""
    if _user_set_malloc():
        return {}
    settings = KEEP if keep_freed_memory else RETURN
    tunables = ":".join(f"glibc.malloc.{_TUNABLE_NAMES[k]}={v}" for k, v in settings.items())
    other = os.environ.get("GLIBC_TUNABLES")
    return {"GLIBC_TUNABLES": f"{other}:{tunables}" if other else tunables}


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system now (glibc's malloc_trim; nothing elsewhere): after
    a load that freed more than it kept, such as a base quantized from its full-precision weights."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
