"""Which CPU cores each vLLM worker and the trainer get when `rl` runs them on a machine without GPUs.

Left to themselves they fight over the same cores. vLLM's CPU backend binds a worker's OpenMP
threads to cores it picks alone (VLLM_CPU_OMP_THREADS_BIND=auto: every worker, and a restarted one,
takes the same first cores of the NUMA node), and its engine process busy-waits (sched_yield) on
the worker's replies while it generates, on whatever core the kernel gives it. On 2 cores that spinner
lands on the trainer's core and halves its forward/backward. So `rl` gives out the cores explicitly,
in one of two ways (inference.time_share):

* split (the default): worker i gets `inference.cpu_threads` × tensor_parallel_size cores of its
  own, the first ones, in order of workers; the trainer the cores that are left, with
  `trainer.num_threads` threads (by default all cores less the workers'); the two run at once.
* taking turns (inference.time_share = true): the workers share every core out among themselves
  and the trainer uses every core too; they never compute at once, as the orchestrator samples
  only while the trainer waits for a batch.

Either way a worker's whole process tree (API server, engine, workers) is confined to its cores
(`python -m lorarl.cpu.cores 0|1 -- vllm ...` sets the affinity and execs vLLM), and its
OpenMP threads are bound to them, one list per tensor-parallel rank (VLLM_CPU_OMP_THREADS_BIND).

By hand (a server started apart, or another split): `taskset -c 0-3 env VLLM_CPU_OMP_THREADS_BIND=0-3
vllm serve ...`, and the trainer with `trainer.num_threads`; docs/performance.md says more.
"""

from __future__ import annotations

import os
import sys

from lorarl.config.serve import WorkersConfig


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity, which a container or taskset may narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))  # macOS: no affinity; nothing here is pinned there


def threads_per_rank(cfg: WorkersConfig, cores: int) -> int:
    """Cores of each vLLM worker's tensor-parallel rank on a machine with `cores` cores:
    inference.cpu_threads, or by default every core shared out between the workers when they take
    turns with the trainer (inference.time_share), else 1."""
    inf = cfg.inference
    if inf.cpu_threads is not None:
        return inf.cpu_threads
    return max(1, cores // (inf.num_workers * inf.tensor_parallel_size)) if inf.time_share else 1


def trainer_threads(cfg: WorkersConfig, cores: int) -> int:
    """Torch threads of each trainer rank beside the workers `rl` starts on this machine's `cores`:
    every core when they take turns, else the cores the workers leave (at least 1)."""
    inf, dp = cfg.inference, cfg.trainer.parallel.dp
    if inf.time_share:
        return max(1, cores // dp)
    taken = inf.num_workers * inf.tensor_parallel_size * threads_per_rank(cfg, cores)
    return max(1, (cores - taken) // dp)


def worker_cores(cfg: WorkersConfig, worker: int, cores: list[int] | None = None) -> list[list[int]]:
    """The cores of worker `worker`'s tensor-parallel ranks, one list per rank, taken from `cores`
    (default: `available_cores`). The workers take the first cores in order and leave the rest to the
    trainer. Where they need every core (taking turns, or two workers on 2 cores) they spread over all
    of them; where they need more, the later ones get the first cores again rather than none, so that a
    run still starts (slower). A restarted worker gets its predecessor's cores."""
    inf = cfg.inference
    cores = available_cores() if cores is None else cores
    threads = threads_per_rank(cfg, len(cores))
    needed = inf.num_workers * inf.tensor_parallel_size * threads
    usable = cores[:-1] if len(cores) > needed else cores
    first = worker * inf.tensor_parallel_size * threads
    return [
        [usable[(first + rank * threads + k) % len(usable)] for k in range(threads)]
        for rank in range(inf.tensor_parallel_size)
    ]


def omp_threads_bind(ranks: list[list[int]]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for these per-rank core lists: "0,1|2,3"."""
    return "|".join(",".join(str(c) for c in rank) for rank in ranks)


def pinned(cmd: list[str], ranks: list[list[int]]) -> list[str]:
    """`cmd` (a vLLM server) run confined to the cores of `ranks`, children included (affinity is
    inherited), with its OpenMP threads bound to them rank by rank."""
    return [sys.executable, "-m", "lorarl.cpu.cores", omp_threads_bind(ranks), "--", *cmd]


def main(argv: list[str] | None = None) -> None:
    """`python -m lorarl.cpu.cores 0,1|2,3 -- cmd ...`: exec cmd on cores 0 to 3 only, with
    VLLM_CPU_OMP_THREADS_BIND=0,1|2,3 (unless the environment sets it already: a hand-made binding wins)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        raise SystemExit("usage: python -m lorarl.cpu.cores CORES[|CORES...] -- command ...")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for rank in args[0].split("|") for c in rank.split(",")})
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", args[0])
    os.execvp(args[2], args[2:])


if __name__ == "__main__":
    main()
