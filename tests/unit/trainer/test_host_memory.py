"""The CPU trainer's tensors go back to the system when freed (trainer/host_memory.py), measured with
glibc's own accounting in a fresh process (the setting is process-wide)."""

from __future__ import annotations

import subprocess
import sys

# Frees a 16 MiB tensor (which raises glibc's dynamic mmap threshold to 16 MiB), then allocates 1 MiB
# and prints how many MiB of it glibc mmapped (mallinfo2's hblkhd): an mmapped block is unmapped when
# freed, a heap block stays resident.
PROBE = """
import ctypes, sys, torch
from lorarl.trainer.host_memory import return_freed_tensors_to_system
class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
return_freed_tensors_to_system(torch.device(sys.argv[1])) if sys.argv[1] != "none" else None
big = torch.ones(16 * 2**18)
del big
before = libc.mallinfo2().hblkhd
tensor = torch.ones(2**18)
print((libc.mallinfo2().hblkhd - before) / 2**20)
"""


def mmapped_mib(device: str) -> float:
    result = subprocess.run([sys.executable, "-c", PROBE, device], capture_output=True, text=True, check=True)
    return float(result.stdout)


def test_on_the_cpu_a_freed_activation_leaves_the_process() -> None:
    assert mmapped_mib("none") == 0.0  # glibc's default: the 1 MiB tensor sits in the heap
    assert mmapped_mib("cpu") >= 1.0
    assert mmapped_mib("meta") == 0.0  # not the CPU (as a GPU): left as it is
