"""`[cluster]`: where `rl` starts its processes, this machine or the nodes of a Ray cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from lorarl.config.common import MIN_WAIT, Section


class ClusterConfig(Section):
    backend: Literal["local", "ray"] = "local"
    """Where `rl` starts the vLLM workers and the trainer: "local": subprocesses on this machine; "ray": on
    the nodes of a Ray cluster, through one placement group (docs/ray_cluster.md). The
    orchestrator always runs where `rl` runs."""
    address: str | None = None
    """The Ray cluster to use (backend "ray"): "auto" (the one `ray start` set up on this node), "host:port"
    of its head (GCS), or "ray://host:port" (Ray Client). None: start a Ray instance on this machine for the
    run, and stop it at the end."""
    shared_fs: bool = True
    """Every node sees the run folder at the same path (NFS, Lustre, ...), which is where adapters and
    rollout batches meet; `rl` checks it at start (each node writes a probe file the others must read) and
    stops, naming the nodes, if not. False: ship each adapter version and each rollout batch through Ray's
    object store to node_dir on the nodes that read it."""
    node_dir: Path = Path("/tmp/lorarl-nodes")
    """With shared_fs = false: the folder on every node under which it keeps its copy of the run folder
    (`<node_dir>/<node id>/<run_name>/`)."""
    trainer_resources: dict[str, float] = {}
    """Ray resources added to the bundle of each trainer rank, to pin the trainer to some nodes: a custom
    resource the nodes were started with (`ray start --resources '{"trainer": 1}'`), or Ray's own
    "node:<ip>" (e.g. {"node:10.0.0.5" = 0.01}). {}: any node with the GPU (or CPU) it needs."""
    inference_resources: dict[str, float] = {}
    """Ray resources added to the bundle of each vLLM worker, as trainer_resources. {}: any node with
    tensor_parallel_size GPUs (or a CPU)."""
    placement_timeout: float = Field(300.0, ge=MIN_WAIT)
    """Seconds to wait for the Ray cluster to grant every bundle (an autoscaler may add nodes meanwhile);
    then `rl` stops and names the bundles it could not place."""
    connect_timeout: float = Field(10.0, ge=MIN_WAIT)
    """Seconds `rl` waits for the Ray head at address ("host:port", "ray://host:port") to accept a
    connection; then it stops with one line naming the address (Ray itself would retry for minutes)."""

    @field_validator("address", mode="after")
    @classmethod
    def _port_in_range(cls, value: str | None) -> str | None:
        port = value.rpartition(":")[2] if value else ""
        if port.isdigit() and not 0 < int(port) < 65536:
            raise ValueError(f"{value!r}: a port is 1-65535")
        return value

    @field_validator("trainer_resources", "inference_resources", mode="after")
    @classmethod
    def _positive_amounts(cls, value: dict[str, float]) -> dict[str, float]:
        if bad := {k: v for k, v in value.items() if not v > 0}:  # NaN included
            raise ValueError(f"{bad}: a bundle asks for a positive amount of each resource")
        return value
