"""Where each process of an `rl` run goes on one node: its GPUs, its port, its log file.

`place(cfg, gpus)` is pure: the number of GPUs is an argument (`visible_gpus` counts them; a dry run
may pretend, `dry_run_devices`), so every placement can be tested without a GPU. GPU ids are indices
among the GPUs `rl` sees, that is after its own CUDA_VISIBLE_DEVICES; the launcher hands each child
its GPUs through CUDA_VISIBLE_DEVICES (`cuda_visible_devices`), so a trainer rank always sees its GPU
as cuda:LOCAL_RANK and a vLLM worker its GPUs as cuda:0..T-1.

The rule, when gpu_ids are left out (docs/gpus.md): the counts are the config's, never changed
here (inference.num_workers × inference.tensor_parallel_size GPUs for vLLM, trainer.parallel.dp for
the trainer); vLLM takes the first GPUs, the trainer the next ones; what is left stays idle. With
inference.colocate_with_trainer both start from GPU 0 and share. A placement that cannot work
raises `PlacementError`, one line naming the keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lorarl.config.run import RLConfig, RunMode
from lorarl.config.serve import ServeConfig, WorkersConfig
from lorarl.run_folder import RunFolder

LOCAL = "local"  # the node of every process on the local backend
RAY = "ray"  # the node of a process Ray will place (cluster.backend = "ray"), until it has


class PlacementError(ValueError):
    """A placement that cannot work; str() is one line for the user, naming the keys."""


@dataclass(frozen=True)
class Slot:
    """Where one process runs."""

    name: str  # "inference-<i>", "orchestrator" or "trainer", as its log file and ProcessSpec
    node: str
    gpus: tuple[int, ...]  # indices among the GPUs rl sees; () on the CPU
    port: str  # what it listens on: a number, a description, or "-"
    log: Path
    host: str | None = None  # the address its node is reached at, when Ray placed it (None: inference.host)
    bundle: str | None = None  # its Ray bundle(s), what it asks of its node (cluster.backend = "ray")

    @property
    def devices(self) -> str:
        if self.bundle is not None:
            return self.bundle
        return f"gpu {_ids(self.gpus)}" if self.gpus else "cpu"


@dataclass(frozen=True)
class Placement:
    gpus: int  # GPUs visible to rl (or pretended by a dry run); 0: the CPU path
    slots: tuple[Slot, ...]
    shared: tuple[int, ...]  # GPUs the trainer shares with vLLM (inference.colocate_with_trainer)
    external: tuple[int, ...]  # GPUs of the vLLM servers at inference.urls (their inference.gpu_ids)
    idle: tuple[int, ...]  # GPUs no process uses
    memory_fraction: float  # of each of its GPUs a vLLM server takes (--gpu-memory-utilization)
    pretended: bool = False  # gpus is a dry run's dry_run_devices, not this machine's
    ray: bool = False  # the slots are Ray bundles (cluster.backend = "ray"): Ray gives each its devices
    ray_gpus: int = 0  # the GPUs those bundles ask for, all together (on their nodes, not this machine's)
    time_share: bool = False  # vLLM and the trainer take turns on what they share (inference.time_share)

    def __getitem__(self, name: str) -> Slot:
        return next(s for s in self.slots if s.name == name)

    def worker_hosts(self) -> list[str] | None:
        """The address of each vLLM worker's node, once Ray has placed them; None: inference.host."""
        hosts = [s.host for s in self.slots if s.name.startswith("inference-")]
        return [h for h in hosts if h is not None] or None

    @property
    def on_gpu(self) -> bool:
        """This machine's GPUs (or a dry run's pretended ones) are placed: CUDA_VISIBLE_DEVICES per slot."""
        return self.gpus > 0

    @property
    def device_gpus(self) -> int:
        """The GPUs the processes run on, here or on Ray's nodes; 0: the CPU path (pinned cores, CPU LoRA)."""
        return self.gpus or self.ray_gpus

    def table(self) -> str:
        """The placement as a table (what `--dry-run` prints and configs/placement.txt holds)."""
        rows = [("process", "node", "devices", "port", "log")]
        rows += [(s.name, s.node, s.devices, s.port, str(s.log)) for s in self.slots]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = ["  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]) for r in rows]
        if self.ray:
            placed = all(s.node != RAY for s in self.slots)
            lines.append(
                "Ray placement group (PACK): one bundle per vLLM worker and per trainer rank; "
                + ("node: the Ray node id" if placed else "Ray picks the nodes when the run starts")
            )
            return "\n".join(lines) + "\n"
        if not self.on_gpu:
            cores = (
                "vLLM and the trainer take turns on every core (inference.time_share)"
                if self.time_share
                else "vLLM workers on cores of their own (inference.cpu_threads), the trainer on the rest"
            )
            lines.append(f"no GPU: every process on the CPU; {cores}")
            return "\n".join(lines) + "\n"
        where = (
            "as --dry-run-devices pretends" if self.pretended else "ids as rl sees them, after its CUDA_VISIBLE_DEVICES"
        )
        lines.append(f"{_count(self.gpus)} ({where})")
        if self.shared:
            lines.append(
                f"shared by vLLM and the trainer: gpu {_ids(self.shared)} (inference.colocate_with_trainer); "
                f"vLLM takes {self.memory_fraction:g} of its memory (inference.gpu_memory_utilization), "
                "the trainer the rest" + ("; they take turns (inference.time_share)" if self.time_share else "")
            )
        if self.external:
            lines.append(f"vLLM servers at inference.urls: gpu {_ids(self.external)} (inference.gpu_ids)")
        if self.idle:
            lines.append(
                f"idle: gpu {_ids(self.idle)} (raise inference.num_workers or trainer.parallel.dp, or list "
                "them in inference.gpu_ids / trainer.gpu_ids, to use them)"
            )
        return "\n".join(lines) + "\n"


def place(cfg: WorkersConfig, gpus: int, pretended: bool = False) -> Placement:
    """Where every process of `rl @ cfg` goes on a machine with `gpus` GPUs (0: none; `pretended` by a
    dry run, RunMode.dry_run_devices), or `PlacementError` if that cannot work."""
    if gpus < 0:
        raise PlacementError(f"a machine cannot have {gpus} GPUs")
    inf, trainer = cfg.inference, cfg.trainer
    workers: list[tuple[int, ...]] = []  # the GPUs of each vLLM worker rl starts
    vllm: list[int] = []  # every GPU vLLM uses: the workers', or with urls those of inference.gpu_ids
    trainer_gpus: tuple[int, ...] = ()
    if gpus == 0:
        for key, given in (("inference.gpu_ids", inf.gpu_ids), ("trainer.gpu_ids", trainer.gpu_ids)):
            if given is not None:
                raise PlacementError(f"{key} = {given}, but this machine has no GPU: leave {key} out")
        workers = [] if inf.urls else [() for _ in range(inf.num_workers)]
    else:
        if not inf.urls:
            workers = inference_gpus(cfg, gpus)
            vllm = [g for w in workers for g in w]
        elif inf.gpu_ids is not None:  # rl starts no vLLM: these are the servers' at urls
            vllm = list(inf.gpu_ids)
            _check_ids("inference.gpu_ids", vllm, gpus, "each vLLM worker needs GPUs of its own")
        trainer_gpus = _trainer_gpus(cfg, gpus, vllm)
    logs = RunFolder(cfg.run_dir).logs
    slots = [
        Slot(f"inference-{i}", LOCAL, ids, str(inf.port + i), logs / f"inference-{i}.log")
        for i, ids in enumerate(workers)
    ]
    slots.append(local_slot(cfg))
    rendezvous = "free (torchrun)" if trainer.parallel.dp > 1 else "-"
    slots.append(Slot("trainer", LOCAL, trainer_gpus, rendezvous, logs / "trainer.log"))
    shared = tuple(sorted(set(vllm) & set(trainer_gpus)))
    # By default they take turns on the GPUs they share; on a CPU splitting its cores measured as fast
    # or faster (docs/performance.md).
    time_share = inf.time_share if inf.time_share is not None else bool(shared) and not inf.urls
    time_share = time_share and not isinstance(cfg, ServeConfig)  # no steps to take turns by: both serve at once
    return Placement(
        gpus=gpus,
        slots=tuple(slots),
        shared=shared,
        external=tuple(sorted(vllm)) if inf.urls else (),
        idle=tuple(g for g in range(gpus) if g not in {*vllm, *trainer_gpus}),
        memory_fraction=inf.memory_fraction,
        pretended=pretended,
        time_share=time_share,
    )


def local_slot(cfg: WorkersConfig, ray: bool = False) -> Slot:
    """The process that runs where the command runs, never placed on a GPU or a Ray node: `rl`'s
    orchestrator, or `lorarl-serve`'s Tinker API (in its own process)."""
    logs = RunFolder(cfg.run_dir).logs
    if isinstance(cfg, ServeConfig):
        return Slot("api", LOCAL, (), str(cfg.serve.port), logs / "serve.log", bundle=_here("lorarl-serve", ray))
    return Slot("orchestrator", LOCAL, (), "-", logs / "orchestrator.log", bundle=_here("rl", ray))


def _here(command: str, ray: bool) -> str | None:
    return f"where {command} runs" if ray else None


def inference_gpus(cfg: WorkersConfig, gpus: int) -> list[tuple[int, ...]]:
    """The GPUs of each vLLM worker (inference.num_workers of them) on a machine with `gpus` GPUs:
    inference.gpu_ids, or the first free ones (those not in trainer.gpu_ids unless colocated). The
    trainer's own default never moves them, so `lorarl-inference @ cfg --worker i` picks what `rl` would."""
    inf = cfg.inference
    size = inf.tensor_parallel_size
    need = inf.num_workers * size
    shape = f"inference.num_workers ({inf.num_workers}) × inference.tensor_parallel_size ({size})"
    if inf.gpu_ids is not None:
        ids = list(inf.gpu_ids)
        if len(ids) != need:
            raise PlacementError(
                f"inference.gpu_ids = {ids} lists {len(ids)} GPUs, but {shape} = {need}: list {need} "
                f"(worker i takes the i-th {size})"
            )
        _check_ids("inference.gpu_ids", ids, gpus, "each vLLM worker needs GPUs of its own")
    else:
        taken = set(cfg.trainer.gpu_ids or ()) if not inf.colocate_with_trainer else set()
        free = [g for g in range(gpus) if g not in taken]
        if len(free) < need:
            whose = f", {len(free)} of them not in trainer.gpu_ids {cfg.trainer.gpu_ids}" if taken else ""
            raise PlacementError(
                f"{shape} = {_count(need)} for vLLM, but {_count(gpus)} visible{whose}: lower them, or list "
                "GPUs in inference.gpu_ids"
            )
        ids = free[:need]
    return [tuple(ids[i : i + size]) for i in range(0, need, size)]


def _trainer_gpus(cfg: WorkersConfig, gpus: int, inference: list[int]) -> tuple[int, ...]:
    inf, dp = cfg.inference, cfg.trainer.parallel.dp
    colocate = inf.colocate_with_trainer
    if cfg.trainer.gpu_ids is not None:
        ids = list(cfg.trainer.gpu_ids)
        if len(ids) != dp:
            raise PlacementError(
                f"trainer.gpu_ids = {ids} lists {len(ids)} GPUs, but trainer.parallel.dp = {dp}: one GPU per rank"
            )
        _check_ids("trainer.gpu_ids", ids, gpus, "each trainer rank needs a GPU of its own")
        both = sorted(set(ids) & set(inference))
        if both and not colocate:
            where = "inference.gpu_ids" if inf.gpu_ids is not None else "vLLM's (inference.gpu_ids left out)"
            raise PlacementError(
                f"trainer.gpu_ids {ids} and {where} {inference} share gpu {_ids(both)}: vLLM would take "
                f"{inf.memory_fraction:g} of its memory and the trainer run out; give each GPUs of its own, or "
                "set inference.colocate_with_trainer = true to share on purpose"
            )
        return tuple(ids)
    free = list(range(gpus)) if colocate else [g for g in range(gpus) if g not in inference]
    if len(free) < dp:
        if colocate:
            raise PlacementError(f"trainer.parallel.dp = {dp} needs {dp} GPUs, but {_count(gpus)} visible: lower it")
        if gpus == 1:
            raise PlacementError(
                "1 GPU visible, but vLLM and the trainer each need GPUs of their own: to share it, set "
                "inference.colocate_with_trainer = true (vLLM then takes inference.gpu_memory_utilization, "
                "0.4 by default, of its memory; docs/gpus.md says how to size it)"
            )
        raise PlacementError(
            f"{_count(gpus)} visible: vLLM takes {len(inference)} (inference.num_workers × "
            f"inference.tensor_parallel_size) and the trainer needs {dp} more (trainer.parallel.dp), "
            f"{len(free)} left; lower them, list GPUs in inference.gpu_ids / trainer.gpu_ids, or share "
            "them with inference.colocate_with_trainer = true"
        )
    return tuple(free[:dp])


def _check_ids(key: str, ids: list[int], gpus: int, why: str) -> None:
    if dup := sorted({g for g in ids if ids.count(g) > 1}):
        raise PlacementError(f"{key} = {ids} lists gpu {_ids(dup)} more than once: {why}")
    if out := [g for g in ids if g >= gpus]:
        raise PlacementError(f"{key} = {ids}: gpu {_ids(out)} does not exist, {_count(gpus)} visible (0-{gpus - 1})")


def cuda_visible_devices(gpus: tuple[int, ...], parent: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a child that gets `gpus` (indices among the GPUs rl sees); `parent`:
    rl's own CUDA_VISIBLE_DEVICES, whose entries those indices select (None: all GPUs visible)."""
    if not parent:
        return ",".join(map(str, gpus))
    entries = [e.strip() for e in parent.split(",")]
    return ",".join(entries[g] for g in gpus)


def worker_gpus(cfg: RLConfig, mode: RunMode, worker: int) -> str | None:
    """CUDA_VISIBLE_DEVICES of `lorarl-inference --worker i`: the GPUs `rl` would give worker i (whatever
    inference.urls says); None on a machine without GPUs."""
    gpus = visible_gpus(mode)
    if gpus == 0:
        if cfg.inference.gpu_ids is not None:
            raise PlacementError(f"inference.gpu_ids = {cfg.inference.gpu_ids}, but this machine has no GPU")
        return None
    if not 0 <= worker < cfg.inference.num_workers:
        raise PlacementError(
            f"--worker {worker}: inference.num_workers = {cfg.inference.num_workers} has workers "
            f"0-{cfg.inference.num_workers - 1}, and only their GPUs are placed"
        )
    parent = None if mode.dry_run_devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    return cuda_visible_devices(inference_gpus(cfg, gpus)[worker], parent)


def visible_gpus(mode: RunMode) -> int:
    """The GPUs `rl` places processes on (and `sft`'s memory plan its ranks): torch's count, or what a
    dry run pretends (dry_run_devices)."""
    if mode.dry_run_devices is not None:
        return mode.dry_run_devices
    import torch

    return torch.cuda.device_count()


def _count(gpus: int) -> str:
    return f"{gpus} GPU{'' if gpus == 1 else 's'}"


def _ids(ids: tuple[int, ...] | list[int]) -> str:
    """0,1,2,3 as 0-3; 0,2,3 as 0,2,3."""
    ids = sorted(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))
