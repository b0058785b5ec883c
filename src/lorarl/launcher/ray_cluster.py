"""`RayCluster`: the `Supervisor` of an `rl` run on a Ray cluster (cluster.backend = "ray").

Each vLLM worker and each trainer rank gets a bundle of one placement group (bundles.py) and, in
it, a small actor, `ProcessHost`, that runs the very command `rl` runs locally (plan.py) with a
`Supervisor` of its own on that node: same entry point, own process group, log in the run folder's
logs/. The orchestrator stays a local subprocess, where `rl` runs. `launch.py` drives this class
exactly as the local `Supervisor`, so failures, restarts, auto_resume and Ctrl-C behave the same;
`stop_all` also removes every actor and the placement group, and stops Ray if `rl` started it.

The run folder is where adapters and rollout batches meet, so before anything starts every node
proves it sees the same one: each writes a probe file there that every other node must read.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from lorarl.config.models import RLConfig
from lorarl.launcher.bundles import Bundle, plan_bundles, ray_placement
from lorarl.launcher.placement import Placement
from lorarl.launcher.plan import ProcessSpec
from lorarl.launcher.supervisor import Supervisor
from lorarl.run_folder import RunFolder

log = logging.getLogger("lorarl.rl")
LOST = -1  # the exit code reported for a process whose node (or actor) was lost


class ClusterError(Exception):
    """The cluster cannot run this config as it is; str() is one line for the user."""


class ProcessHost:
    """Runs on the node of its bundle: starts, polls, stops and tails one process there. A Ray actor
    (`ray.remote(ProcessHost)`), so every method returns plain values."""

    def __init__(self, log_dir: str, cwd: str) -> None:
        # The run's relative paths (output_dir, a model folder) mean what they mean where rl runs.
        if os.path.isdir(cwd):
            os.chdir(cwd)
        self.supervisor = Supervisor(Path(log_dir))

    def node(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def start(self, spec: ProcessSpec, python: str) -> int:
        # The interpreter of this node, where rl's own (`python`) stands in the command.
        cmd = [sys.executable if part == python else part for part in spec.cmd]
        return self.supervisor.start(ProcessSpec(spec.name, cmd, spec.env)).pid

    def poll(self) -> int | None:
        return next(iter(self.supervisor.procs.values())).poll() if self.supervisor.procs else None

    def stop(self, grace: float) -> None:
        self.supervisor.stop_all(grace)

    def tail(self, name: str, lines: int) -> str:
        return self.supervisor.tail(name, lines)

    def probe(self, path: str, node: str) -> None:
        Path(path).write_text(node)

    def unseen(self, paths: list[str]) -> list[str]:
        """The probe files of `paths` that this node cannot read."""
        return [p for p in paths if not os.path.isfile(p)]


class RayCluster:
    """The `Supervisor` interface over processes placed by Ray, and the orchestrator run locally."""

    def __init__(self, cfg: RLConfig, run: RunFolder) -> None:
        self.cfg, self.run = cfg, run
        self.local = Supervisor(run.logs)
        self.bundles: list[Bundle] = []
        self.hosts: list[Any] = []  # one ProcessHost actor per bundle
        self.nodes: list[tuple[str, str]] = []  # (node id, address) of each bundle
        self.group: Any = None

    def open(self) -> Placement:
        """Connect to (or start) Ray, place every bundle, start an actor in each and check that every
        node sees the run folder; returns where each process went."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cluster = self.cfg.cluster
        if cluster.address is None:  # a Ray instance of the run's own
            ray.init(namespace="lorarl", log_to_driver=False, include_dashboard=False)
        else:
            ray.init(address=cluster.address, namespace="lorarl", log_to_driver=False)
        gpus = ray.cluster_resources().get("GPU", 0) > 0
        self.bundles = plan_bundles(self.cfg, gpus)
        self.group = placement_group([b.resources for b in self.bundles], strategy="PACK",
                                     name=f"lorarl-{self.cfg.run_name}-{os.getpid()}")  # fmt: skip
        try:
            ray.get(self.group.ready(), timeout=cluster.placement_timeout)
        except ray.exceptions.GetTimeoutError:
            asked = "; ".join(f"{b.process} {b.describe()}" for b in self.bundles)
            raise ClusterError(
                f"cluster.placement_timeout: the Ray cluster at {cluster.address or 'this machine'} did not grant "
                f"every bundle in {cluster.placement_timeout:g} s ({asked}; it has {ray.cluster_resources()}): "
                "add nodes, or lower inference.num_workers / trainer.parallel.dp"
            ) from None
        actor = ray.remote(ProcessHost)
        for i, b in enumerate(self.bundles):
            custom = {k: v for k, v in b.resources.items() if k not in ("CPU", "GPU")}
            self.hosts.append(actor.options(
                num_cpus=b.resources.get("CPU", 0), num_gpus=b.resources.get("GPU", 0), resources=custom,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i),
            ).remote(str(self.run.logs), os.getcwd()))  # fmt: skip
        self.nodes = ray.get([h.node.remote() for h in self.hosts])
        self.check_shared_folder(ray.get_runtime_context().get_node_id())
        return ray_placement(self.cfg, self.bundles, self.nodes)

    def check_shared_folder(self, here: str) -> None:
        """Every node, this one too, reads the probe file every other node wrote in the run folder."""
        import ray

        names = {here: "rl", **{node: b.process for b, (node, _) in zip(self.bundles, self.nodes, strict=True)}}
        probes = {node: str(self.run.probe(node)) for node in names}
        self.run.root.mkdir(parents=True, exist_ok=True)
        self.run.probe(here).write_text(here)
        first = {node: h for h, (node, _) in reversed(list(zip(self.hosts, self.nodes, strict=True)))}
        ray.get([h.probe.remote(probes[node], node) for node, h in first.items()])
        try:
            local_unseen = [p for p in probes.values() if not os.path.isfile(p)]
            unseen = dict(zip(first, ray.get([h.unseen.remote(list(probes.values())) for h in first.values()]),
                              strict=True))  # fmt: skip
            unseen[here] = local_unseen
            writer = {p: node for node, p in probes.items()}
            if blind := {node: [writer[p] for p in paths] for node, paths in unseen.items() if paths}:
                node, missed = next(iter(blind.items()))
                raise ClusterError(
                    f"cluster.shared_fs: the run folder {self.run.root} is not shared: node {node[:12]} "
                    f"({names[node]}) does not see what node(s) {', '.join(f'{m[:12]} ({names[m]})' for m in missed)} "
                    "wrote there; put output_dir on a file system every node mounts at the same path"
                )
        finally:
            for p in probes.values():
                Path(p).unlink(missing_ok=True)

    def _mine(self, name: str) -> list[int]:
        return [i for i, b in enumerate(self.bundles) if b.process == name]

    def log_path(self, name: str) -> Path:
        return self.local.log_path(name)

    def start(self, spec: ProcessSpec) -> None:
        import ray

        if not (mine := self._mine(spec.name)):
            self.local.start(spec)
            return
        env = dict(spec.env)
        if len(mine) > 1:  # trainer ranks, one process each; torch.distributed meets on rank 0's node
            port = ray.get(self.hosts[mine[0]].free_port.remote())
            env |= {"WORLD_SIZE": str(len(mine)), "MASTER_ADDR": self.nodes[mine[0]][1], "MASTER_PORT": str(port),
                    "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}  # fmt: skip # Ray shows each rank its own GPU
        specs = {i: ProcessSpec(self._log_name(i), spec.cmd, env | self._rank_env(i)) for i in mine}
        ray.get([self.hosts[i].start.remote(s, sys.executable) for i, s in specs.items()])

    def _log_name(self, i: int) -> str:
        b = self.bundles[i]
        return f"{b.process}-rank{b.rank}" if b.process == "trainer" and b.rank else b.process

    def _rank_env(self, i: int) -> dict[str, str]:
        b = self.bundles[i]
        return {"RANK": str(b.rank)} if self.cfg.trainer.parallel.dp > 1 and b.process == "trainer" else {}

    def _polls(self) -> list[int | None]:
        import ray

        codes: list[int | None] = []
        for i, h in enumerate(self.hosts):
            try:
                codes.append(ray.get(h.poll.remote()))
            except ray.exceptions.RayError as e:  # the actor or its node is gone
                log.error("%s: lost its Ray actor on node %s: %s", self._log_name(i), self.nodes[i][0][:12], e)
                codes.append(LOST)
        return codes

    def failed(self) -> tuple[str, int] | None:
        for i, code in enumerate(self._polls()):
            if code not in (None, 0):
                return self.bundles[i].process, code
        return self.local.failed()

    def finished(self, names: list[str]) -> bool:
        codes = self._polls()
        remote = [n for n in names if self._mine(n)]
        return all(codes[i] == 0 for n in remote for i in self._mine(n)) and self.local.finished(
            [n for n in names if n not in remote]
        )

    def stop(self, names: list[str], grace: float = 15.0) -> None:
        import ray

        self.local.stop([n for n in names if not self._mine(n) and n in self.local.procs], grace)
        calls = [self.hosts[i].stop.remote(grace) for n in names for i in self._mine(n)]
        for call in calls:
            try:
                ray.get(call, timeout=grace + 30)
            except ray.exceptions.RayError as e:
                log.warning("stopping a placed process: %s", e)

    def stop_all(self, grace: float = 15.0) -> None:
        """Stop every process, then remove every actor and the placement group; stop Ray if rl started it."""
        import ray

        if not ray.is_initialized():
            return
        try:
            self.stop([*dict.fromkeys(b.process for b in self.bundles), *self.local.procs], grace)
        finally:
            for h in self.hosts:
                ray.kill(h)
            if self.group is not None:
                ray.util.remove_placement_group(self.group)
            ray.shutdown()  # a Ray instance rl started stops with it; a cluster's stays up

    def tail(self, name: str, lines: int = 40) -> str:
        import ray

        if not (mine := self._mine(name)):
            return self.local.tail(name, lines)
        failing = next((i for i in mine if self._polls()[i] not in (None, 0)), mine[0])
        try:
            return str(ray.get(self.hosts[failing].tail.remote(self._log_name(failing), lines)))
        except ray.exceptions.RayError as e:
            return f"(its node {self.nodes[failing][0][:12]} is lost: {e})\n"
