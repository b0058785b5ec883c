"""Host memory on a CPU: what glibc's malloc does with the tensors a trainer step or a vLLM step frees.

Each step allocates and frees the same activations again. Two policies (`keep_freed_memory`):

* keep (the default): malloc never maps a block of its own nor trims its heap, so what one step frees
  the next one reuses, and after the first step nothing is faulted in again. A page fault is dear in a
  virtual machine: this 2-core one hands freed pages back to its host (the balloon's free page
  reporting), and the 24M-parameter benchmark's trainer step inside `rl` took 14.3 s on one core with
  every freed tensor unmapped against 7.2 s kept; `rl`'s step 14.8 -> 7.5 s (docs/benchmarks.md).
  The resident size then stays at the step's peak plus the heap's fragments.
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
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
MMAP_THRESHOLD_BYTES = 128 * 1024
# mallopt's largest value: the heap is trimmed only when 2 GiB at its top are free.
KEEP_TRIM_THRESHOLD_BYTES = 2**31 - 1
KEEP = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: KEEP_TRIM_THRESHOLD_BYTES}
RETURN = {M_MMAP_THRESHOLD: MMAP_THRESHOLD_BYTES}
_TUNABLE_NAMES = {M_MMAP_MAX: "mmap_max", M_TRIM_THRESHOLD: "trim_threshold", M_MMAP_THRESHOLD: "mmap_threshold"}


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
