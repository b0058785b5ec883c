"""The Ray placement group of an `rl` run or a `lorarl-serve` (cluster.backend = "ray"): what each
placed process asks of its node.

One bundle per vLLM worker (tensor_parallel_size GPUs, which a bundle keeps on one node, or one
CPU on a cluster without GPUs) and one per trainer rank (a GPU, or a CPU), all in one placement
group with the PACK strategy, so the trainer's ranks share as few nodes as fit. The orchestrator (or
`lorarl-serve`'s API) gets no bundle: it runs where the command runs. Pure, like placement.py:
whether the bundles ask for GPUs is an argument, so `--dry-run` shows them without contacting a
cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lorarl.config.serve import WorkersConfig
from lorarl.launcher.placement import RAY, Placement, Slot, local_slot
from lorarl.run_folder import RunFolder


@dataclass(frozen=True)
class Bundle:
    process: str  # "inference-<i>" or "trainer", as its ProcessSpec
    rank: int  # the trainer rank it holds; 0 for a vLLM worker
    resources: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        return "{" + ", ".join(f"{k}: {v:g}" for k, v in self.resources.items()) + "}"


def plan_bundles(cfg: WorkersConfig, gpus: bool) -> list[Bundle]:
    """The bundles of `rl @ cfg` (or `lorarl-serve @ cfg`) on a Ray cluster with (`gpus`) or without
    GPUs, vLLM workers first."""
    inf, cluster = cfg.inference, cfg.cluster
    worker = {"CPU": 1.0, "GPU": float(inf.tensor_parallel_size)} if gpus else {"CPU": 1.0}
    rank = {"CPU": 1.0, "GPU": 1.0} if gpus else {"CPU": 1.0}
    bundles = [
        Bundle(f"inference-{i}", 0, {**worker, **cluster.inference_resources})
        for i in range(0 if inf.urls else inf.num_workers)
    ]
    bundles += [Bundle("trainer", r, {**rank, **cluster.trainer_resources}) for r in range(cfg.trainer.parallel.dp)]
    return bundles


def ray_placement(cfg: WorkersConfig, bundles: list[Bundle], nodes: list[tuple[str, str]] | None = None) -> Placement:
    """The placement table of `bundles`; `nodes`: the (node id, address) Ray gave each bundle, once it has."""
    logs = RunFolder(cfg.run_dir).logs
    slots = []
    for name in dict.fromkeys(b.process for b in bundles):  # in bundle order, each process once
        mine = [i for i, b in enumerate(bundles) if b.process == name]
        ids = list(dict.fromkeys(nodes[i][0][:12] for i in mine)) if nodes else [RAY]
        host = nodes[mine[0]][1] if nodes else None
        if name == "trainer":
            port = "free (rank 0's node)" if len(mine) > 1 else "-"
            what = " ".join(f"rank {bundles[i].rank} {bundles[i].describe()}" for i in mine)
        else:
            port = f"{host or 'its node'}:{cfg.inference.port + int(name.split('-')[1])}"
            what = bundles[mine[0]].describe()
        slots.append(Slot(name, ",".join(ids), (), port, logs / f"{name}.log", host, what))
    slots.insert(len(slots) - 1 if slots and slots[-1].name == "trainer" else len(slots), local_slot(cfg, ray=True))
    return Placement(
        gpus=0,
        slots=tuple(slots),
        shared=(),
        external=(),
        idle=(),
        memory_fraction=0.0,
        ray=True,
        ray_gpus=round(sum(b.resources.get("GPU", 0.0) for b in bundles)),
        time_share=bool(cfg.inference.time_share),  # workers on nodes of their own overlap by default
    )
