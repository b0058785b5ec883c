"""Data parallel for the trainers: N ranks (torchrun), each on its share of the batch.

Every rank reads the whole batch, so the loss denominators are global and summing the ranks'
gradients gives exactly the single-process gradient; the adapter stays identical on every rank
and rank 0 alone writes broadcasts, checkpoints and metrics. With `fsdp` the ranks also shard the
model's weights (fsdp.py): every forward pass and every save then gathers from all ranks, so the
loops save on every rank (rank 0 writes) and every rank makes as many passes as the others
(`same_passes`, which trainer.py runs for both loops).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from lorarl.config.trainer import ParallelConfig
from lorarl.trainer.fsdp import shard_model

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world_size: int = 1
    fsdp: bool = False  # the ranks shard the model's weights (fsdp.py)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list[T]) -> list[T]:
        return items[self.rank :: self.world_size]

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")

    def sync_parameters(self, params: list[torch.nn.Parameter]) -> None:
        """Start every rank from rank 0's weights (a fresh LoRA init is random). Before `place`."""
        if self.world_size > 1:
            for p in params:
                # Through the rank's device: NCCL sends from GPUs only, and the model is still on the CPU.
                on_device = p.data.to(self.device())
                dist.broadcast(on_device, src=0)
                p.data.copy_(on_device)

    def place(self, model: torch.nn.Module) -> None:
        """Move the model to this rank's device, or with `fsdp` shard it over the ranks there (the
        parameters are new objects then: build the optimizer after this)."""
        if self.fsdp:
            shard_model(model)
        else:
            model.to(self.device())

    def same_passes(self, batches: Iterable[T], filler: T) -> Iterator[T]:
        """`batches`, then `filler` (a batch without loss tokens) until every rank has run out. With
        `fsdp` every forward pass gathers weights from all ranks, so all make the same number of passes,
        however many samples their share holds. Without: `batches` alone."""
        if not self.fsdp:
            yield from batches
            return
        mine = iter(batches)
        while True:
            batch = next(mine, None)
            more = torch.tensor([batch is not None], dtype=torch.int32, device=self.device())
            dist.all_reduce(more, op=dist.ReduceOp.MAX)
            if not more.item():
                return
            yield filler if batch is None else batch

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        # With `fsdp` each backward pass has summed them already (reduce-scatter, fsdp.py).
        if self.world_size > 1 and not self.fsdp:
            for p in params:
                if p.grad is None:  # a rank with no samples this step
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)

    def sum_values(self, values: dict[str, float]) -> dict[str, float]:
        """Sum each value over ranks (per-rank shares of a batch-wide mean add up to the mean)."""
        if self.world_size == 1:
            return values
        # As objects: a rank without samples this step has fewer keys than the others.
        gathered: list[dict[str, float]] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(gathered, values)
        return {k: sum(g.get(k, 0.0) for g in gathered) for k in set().union(*gathered)}

    def close(self) -> None:
        if self.world_size > 1:
            dist.destroy_process_group()


def is_main_process() -> bool:
    """Rank 0, or a process without data parallel."""
    return not dist.is_initialized() or dist.get_rank() == 0


def init_data_parallel(parallel: ParallelConfig) -> DataParallel:
    """From torchrun's environment, which must hold the `parallel.dp` ranks the config asks for (a
    plain process is rank 0 of 1, unsharded)."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size != parallel.dp:
        raise RuntimeError(
            f"parallel.dp = {parallel.dp}, but this process is one of {world_size} rank(s): start the trainer "
            f"through rl / sft, which run it under torchrun, or as `torchrun --nproc-per-node {parallel.dp} ...`"
        )
    if world_size == 1:
        return DataParallel()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    return DataParallel(dist.get_rank(), world_size, parallel.fsdp)
