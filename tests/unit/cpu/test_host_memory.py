"""malloc's policy on a CPU (cpu/host_memory.py), measured with glibc's own accounting in fresh processes
(the setting is process-wide): kept, a freed block under 32 MiB is reused from the heap instead of
mapped again; returned, a block of 128 KiB or more is mapped, so that freeing it unmaps it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lorarl.cpu.host_memory import malloc_tunables

# Frees a 16 MiB tensor (which raises glibc's dynamic mmap threshold to 16 MiB), then allocates 1, 24
# and 64 MiB and prints how many MiB of each glibc mmapped (mallinfo2's hblkhd), and the heap's size
# (arena) after they are freed: an mmapped block is unmapped when freed, a heap block stays.
PROBE = """
import ctypes, json, sys, torch
from lorarl.cpu.host_memory import set_host_malloc
class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] != "none":
    set_host_malloc(sys.argv[1] == "cpu", sys.argv[2] == "keep")
big = torch.ones(16 * 2**18)
del big
mapped, tensors = {}, []
for mib in (1, 24, 64):
    before = libc.mallinfo2().hblkhd
    tensors.append(torch.ones(mib * 2**18))
    mapped[mib] = (libc.mallinfo2().hblkhd - before) / 2**20
del tensors
print(json.dumps({"mapped": mapped, "heap_mib": libc.mallinfo2().arena / 2**20}))
"""


def probe(*args: str, env: dict[str, str] | None = None) -> dict:
    run_env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | (env or {})
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True, env=run_env
    )
    return json.loads(result.stdout)


def same_policy(one: dict, other: dict) -> bool:
    """The same blocks mapped, and heaps within 1 MiB: the probe's own small objects (a few KiB) vary
    from run to run, while a kept 24 MiB block would move the heap by 24 MiB."""
    return one["mapped"] == other["mapped"] and abs(one["heap_mib"] - other["heap_mib"]) < 1


@pytest.mark.slow
def test_kept_freed_memory_under_32_mib_stays_in_the_heap() -> None:
    kept = probe("cpu", "keep")
    assert kept["mapped"]["1"] == 0.0 and kept["mapped"]["24"] == 0.0
    assert kept["mapped"]["64"] >= 64  # above glibc's largest threshold: mapped, and unmapped when freed
    # The freed 25 MiB stay in the process for the next step (the heap also holds torch's own objects).
    assert kept["heap_mib"] >= probe("cpu", "return")["heap_mib"] + 24
    assert probe("none")["mapped"]["24"] >= 24  # glibc's default threshold is then 16 MiB


@pytest.mark.slow
def test_returned_freed_memory_leaves_the_process() -> None:
    returned = probe("cpu", "return")
    assert all(returned["mapped"][mib] >= int(mib) for mib in ("1", "24", "64"))
    assert probe("none")["mapped"]["1"] == 0.0  # glibc's default: 1 MiB sits in the heap


@pytest.mark.slow
def test_tensors_not_on_the_cpu_leave_malloc_as_it_is() -> None:
    assert same_policy(probe("gpu", "return"), probe("none"))


@pytest.mark.slow
@pytest.mark.parametrize("keep", [True, False])
def test_a_process_started_with_the_tunables_gets_the_same_policy(keep: bool) -> None:
    """vLLM's workers get the policy through their environment: the same result as mallopt in-process."""
    env = malloc_tunables(keep)
    assert probe("none", env=env)["mapped"] == probe("cpu", "keep" if keep else "return")["mapped"]


@pytest.mark.slow
def test_malloc_settings_in_the_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = "glibc.malloc.arena_max=2"
    monkeypatch.setenv("GLIBC_TUNABLES", mine)
    assert malloc_tunables(True) == {}
    # set_host_malloc leaves them too: the probe behaves as glibc with the user's setting alone.
    assert same_policy(probe("cpu", "keep", env={"GLIBC_TUNABLES": mine}), probe("none", env={"GLIBC_TUNABLES": mine}))
    # Other tunables are kept beside lorarl's.
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.x86_shstk=off")
    assert malloc_tunables(True)["GLIBC_TUNABLES"].startswith("glibc.cpu.x86_shstk=off:glibc.malloc.mmap_threshold=")
