"""Data parallel for the trainers: N ranks (torchrun), each on its share of the batch.

Every rank reads the whole batch, so the loss denominators are global and summing the ranks'
gradients gives exactly the single-process gradient; the adapter stays identical on every rank
and rank 0 alone writes broadcasts, checkpoints and metrics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world_size: int = 1

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
        """Start every rank from rank 0's weights (a fresh LoRA init is random)."""
        if self.world_size > 1:
            for p in params:
                dist.broadcast(p.data, src=0)

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        if self.world_size > 1:
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


def init_data_parallel() -> DataParallel:
    """From torchrun's environment; a plain process is rank 0 of 1."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size == 1:
        return DataParallel()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    return DataParallel(dist.get_rank(), world_size)
