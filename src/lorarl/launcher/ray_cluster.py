"""`RayCluster`: the `Supervisor` of an `rl` run or a `lorarl-serve` on a Ray cluster (cluster.backend = "ray").

Each vLLM worker and each trainer rank gets a bundle of one placement group (ray_bundles.py) and, in
it, a small actor, `ProcessHost`, that runs the very command `rl` runs locally (plan.py) with a
`Supervisor` of its own on that node: same entry point, own process group, log in the run folder's
logs/ (with cluster.shared_fs = false, in the node's copy, fetched at the end). The orchestrator
stays a local subprocess, where `rl` runs (`lorarl-serve`'s API, in its own process there).
`launch.py` (and launcher/serve.py) drive this class exactly as the local `Supervisor`, so
failures, restarts, auto_resume and Ctrl-C behave the same; `stop_all` also
removes every actor and the placement group, and stops Ray if `rl` started it. One thing differs: a
process whose actor (its node) is lost is not restarted, since its bundle is gone with the node; the
run stops with one line naming the node, to be resumed with `--resume` (`ClusterError`).

Connecting is bounded: the head at cluster.address must accept a TCP connection within
cluster.connect_timeout, or `rl` stops with one line, where Ray would retry for minutes in code that
no signal interrupts. Ray's driver installs a SIGTERM handler of its own; `rl`'s is put back.

The run folder is where adapters and rollout batches meet, so before anything starts every node
proves it sees the same one: each writes a probe file there that every other node must read.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from lorarl.config.run import RLConfig
from lorarl.config.serve import ServeConfig
from lorarl.launcher.placement import Placement
from lorarl.launcher.plan import ProcessSpec
from lorarl.launcher.ray_bundles import Bundle, plan_bundles, ray_placement
from lorarl.launcher.relay import Relay, read_lines, write_file
from lorarl.launcher.supervisor import Supervisor
from lorarl.run_folder import MARKER, RunFolder
from lorarl.written_files import record_written

log = logging.getLogger("lorarl.rl")
T = TypeVar("T")
Config = TypeVar("Config", RLConfig, ServeConfig)  # rl's or lorarl-serve's


class ClusterError(Exception):
    """The cluster cannot run this config as it is; str() is one line for the user."""


def first_line(e: BaseException) -> str:
    """The first line of a Ray error, whose str() goes on with the dead actor's whole description."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def unreachable(address: str, timeout: float) -> str | None:
    """Why nothing accepts a connection at `address` ("host:port" or "ray://host:port") within `timeout`
    seconds, or None when something does."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def init_ray(address: str | None) -> None:
    """`ray.init`, with `rl`'s SIGTERM handler kept: Ray's own turns SIGTERM into SystemExit(15)."""
    import ray

    handler = signal.getsignal(signal.SIGTERM)
    try:
        if address is None:  # a Ray instance of the run's own
            ray.init(namespace="lorarl", log_to_driver=False, include_dashboard=False)
        else:
            ray.init(address=address, namespace="lorarl", log_to_driver=False)
    except SystemExit as e:
        if e.code == signal.SIGTERM:  # a SIGTERM while connecting, through Ray's handler: give it to rl's
            signal.signal(signal.SIGTERM, handler)
            signal.raise_signal(signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, handler)


def existing(paths: list[str]) -> list[str]:
    """Those of `paths` that this node sees."""
    return [p for p in paths if os.path.isfile(p)]


def unshared_error(root: Path, roles: dict[str, str], probes: dict[str, str], seen: dict[str, list[str]]) -> str | None:
    """The error naming a node that misses another's probe file (`probes`: node -> its file; `seen`: node ->
    the files it sees; `roles`: node -> what runs there), or None when every node sees every probe."""
    for node, files in seen.items():
        if missed := [other for other, probe in probes.items() if probe not in files]:
            others = ", ".join(f"{m[:12]} ({roles[m]})" for m in missed)
            return (
                f"cluster.shared_fs: the run folder {root} is not shared: node {node[:12]} ({roles[node]}) does not "
                f"see what node(s) {others} wrote there; put output_dir on a file system every node mounts at the "
                "same path, or set cluster.shared_fs = false"
            )
    return None


class ProcessHost:
    """Runs on the node of its bundle: starts, polls, stops and tails one process there. A Ray actor
    (`ray.remote(ProcessHost)`), so every method returns plain values."""

    def __init__(self, cwd: str) -> None:
        # The run's relative paths (output_dir, a model folder) mean what they mean where rl runs.
        if os.path.isdir(cwd):
            os.chdir(cwd)
        self.supervisor: Supervisor | None = None

    def node(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def start(self, spec: ProcessSpec, python: str, log_dir: str) -> int:
        # The interpreter of this node, where rl's own (`python`) stands in the command.
        cmd = [sys.executable if part == python else part for part in spec.cmd]
        self.supervisor = self.supervisor or Supervisor(Path(log_dir))
        return self.supervisor.start(dataclasses.replace(spec, cmd=cmd)).pid

    def poll(self) -> int | None:
        procs = self.supervisor.procs if self.supervisor else {}
        return next(iter(procs.values())).poll() if procs else None

    def stop(self, grace: float) -> None:
        if self.supervisor:
            self.supervisor.stop_all(grace)

    def tail(self, name: str, lines: int) -> str:
        return self.supervisor.tail(name, lines) if self.supervisor else ""

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on this node: the relay's reads and writes of the node's run folder (relay.py)."""
        return fn(*args)


class RayCluster(Generic[Config]):
    """The `Supervisor` interface over processes placed by Ray, and the orchestrator run locally."""

    def __init__(self, cfg: Config, run: RunFolder) -> None:
        self.cfg: Config = cfg
        self.run = run
        self.local = Supervisor(run.logs)
        self.bundles: list[Bundle] = []
        self.hosts: list[Any] = []  # one ProcessHost actor per bundle
        self.nodes: list[tuple[str, str]] = []  # (node id, address) of each bundle
        self.group: Any = None
        self.roots: list[str] = []  # the run folder each bundle's process uses on its node
        self.relay: Relay | None = None  # cluster.shared_fs = false

    def open(self) -> Placement:
        """Connect to (or start) Ray, place every bundle, start an actor in each and check that every
        node sees the run folder; returns where each process went."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cluster = self.cfg.cluster
        if cluster.address not in (None, "auto") and (why := unreachable(cluster.address, cluster.connect_timeout)):
            raise ClusterError(
                f"cluster.address {cluster.address}: no Ray cluster answers there ({why}; cluster.connect_timeout = "
                f"{cluster.connect_timeout:g} s): start its head (`ray start --head`), or correct the address"
            )
        try:
            init_ray(cluster.address)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ClusterError(
                f"cluster.address {cluster.address}: cannot reach the Ray cluster: {first_line(e)}"
            ) from None
        gpus = ray.cluster_resources().get("GPU", 0) > 0
        self.bundles = plan_bundles(self.cfg, gpus)
        self.group = placement_group(
            [b.resources for b in self.bundles], strategy="PACK", name=f"lorarl-{self.cfg.run_name}-{os.getpid()}"
        )
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
            self.hosts.append(
                actor.options(
                    num_cpus=b.resources.get("CPU", 0),
                    num_gpus=b.resources.get("GPU", 0),
                    resources=custom,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i),
                ).remote(os.getcwd())
            )
        self.nodes = ray.get([h.node.remote() for h in self.hosts])
        if cluster.shared_fs:
            self.check_shared_folder(ray.get_runtime_context().get_node_id())
            self.roots = [str(self.run.root)] * len(self.bundles)
        else:
            self.start_relay()
        return ray_placement(self.cfg, self.bundles, self.nodes)

    def start_relay(self) -> None:
        """Give each node a run folder of its own, tell the orchestrator where the workers' are, and
        start carrying adapters, batches and metrics between them."""
        assert isinstance(self.cfg, RLConfig), "lorarl-serve needs cluster.shared_fs (preflight)"
        node_dir = Path(os.path.abspath(self.cfg.cluster.node_dir))
        self.roots = [str(node_dir / node / self.cfg.run_name) for node, _ in self.nodes]
        inference = [i for i, b in enumerate(self.bundles) if b.process != "trainer"]
        dirs = [self.roots[i] for i in inference]
        self.cfg = self.cfg.model_copy(
            update={"inference": self.cfg.inference.model_copy(update={"worker_run_dirs": dirs})}
        )

        def each_node(indices: list[int]) -> list[tuple[Any, str]]:
            return list({self.nodes[i][0]: (self.hosts[i], self.roots[i]) for i in indices}.values())

        trainers = self._mine("trainer")
        self.relay = Relay(
            self.run,
            (self.hosts[trainers[0]], self.roots[trainers[0]]),
            each_node(inference),
            each_node(trainers),
            self.cfg.trainer.keep_rollouts,
        )
        self.relay.start()

    def check_shared_folder(self, here: str) -> None:
        """Every node, this one too, reads the probe file every other node wrote in the run folder."""
        import ray

        roles = {node: b.process for b, (node, _) in zip(self.bundles, self.nodes, strict=True)} | {here: "rl"}
        probes = {node: str(self.run.probe(node)) for node in roles}
        # One actor per node does the node's part.
        hosts = {node: h for h, (node, _) in reversed(list(zip(self.hosts, self.nodes, strict=True))) if node != here}
        self.run.root.mkdir(parents=True, exist_ok=True)
        try:
            write_file(probes[here], here)
            ray.get([h.call.remote(write_file, probes[node], node) for node, h in hosts.items()])
            seen = dict(
                zip(
                    hosts,
                    ray.get([h.call.remote(existing, list(probes.values())) for h in hosts.values()]),
                    strict=True,
                )
            )
            seen[here] = existing(list(probes.values()))
            if error := unshared_error(self.run.root, roles, probes, seen):
                raise ClusterError(error)
        finally:
            for p in probes.values():
                Path(p).unlink(missing_ok=True)

    def free_port(self, name: str) -> int:
        """A port free on the node of process `name` (its first bundle's)."""
        import ray

        return int(ray.get(self.hosts[self._mine(name)[0]].free_port.remote()))

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
            port = self.free_port(spec.name)
            env |= {
                "WORLD_SIZE": str(len(mine)),
                "MASTER_ADDR": self.nodes[mine[0]][1],
                "MASTER_PORT": str(port),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
            }  # Ray shows each rank its own GPU
        specs = {
            i: dataclasses.replace(
                spec, name=self._log_name(i), cmd=self._command(spec, i), env=env | self._rank_env(i)
            )
            for i in mine
        }
        try:
            ray.get([self.hosts[i].start.remote(s, sys.executable, f"{self.roots[i]}/logs") for i, s in specs.items()])
        except ray.exceptions.RayError as e:  # e.g. a worker restarted on a node that is gone
            raise ClusterError(self._lost(mine[0], e)) from None

    def _command(self, spec: ProcessSpec, i: int) -> list[str]:
        """`spec`'s command for bundle i. With cluster.shared_fs = false, a trainer rank's config goes to
        its node's run folder first, with output_dir pointed there."""
        import ray

        local = str(self.run.configs / "trainer.json")
        if spec.name != "trainer" or self.relay is None:
            return spec.cmd
        there = f"{self.roots[i]}/configs/trainer.json"
        cfg = {**json.loads(Path(local).read_text()), "output_dir": str(Path(self.roots[i]).parent)}
        ray.get(self.hosts[i].call.remote(write_file, there, json.dumps(cfg, indent=2)))
        # The run's marker: the trainer writes only into a folder that bears it (RunFolder.check_prepared).
        ray.get(self.hosts[i].call.remote(write_file, f"{self.roots[i]}/{MARKER}", self.run.marker.read_text()))
        return [there if part == local else part for part in spec.cmd]

    def _log_name(self, i: int) -> str:
        b = self.bundles[i]
        return f"{b.process}-rank{b.rank}" if b.process == "trainer" and b.rank else b.process

    def _rank_env(self, i: int) -> dict[str, str]:
        b = self.bundles[i]
        return {"RANK": str(b.rank)} if self.cfg.trainer.parallel.dp > 1 and b.process == "trainer" else {}

    def _lost(self, i: int, e: BaseException) -> str:
        """The one line that stops a run whose bundle i lost its actor (its node, most often)."""
        node, address = self.nodes[i]
        return (
            f"{self._log_name(i)}: its Ray node {node[:12]} ({address}) is lost, and the process with it "
            f"({first_line(e)}); the run stops. Once the cluster has room for it again, run the same command with "
            "--resume to go on from the last checkpoint"
        )

    def _polls(self) -> list[int | None]:
        """Each bundle's exit code (None: running); raises `ClusterError` for a lost actor."""
        import ray

        codes: list[int | None] = []
        for i, h in enumerate(self.hosts):
            try:
                codes.append(ray.get(h.poll.remote()))
            except ray.exceptions.RayError as e:  # the actor or its node is gone
                raise ClusterError(self._lost(i, e)) from None
        return codes

    def failed(self) -> tuple[str, int] | None:
        for i, code in enumerate(self._polls()):  # first: a lost node also fails the relay
            if code not in (None, 0):
                return self.bundles[i].process, code
        if self.relay is not None and self.relay.error is not None:
            return "relay", 1  # its log: logs/relay.log
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
        # Only the actors there are: a start that failed halfway has fewer than bundles.
        calls = [self.hosts[i].stop.remote(grace) for n in names for i in self._mine(n) if i < len(self.hosts)]
        for call in calls:
            try:
                ray.get(call, timeout=grace + 30)
            except ray.exceptions.RayError as e:
                log.warning("stopping a placed process: %s", first_line(e))

    def stop_all(self, grace: float = 15.0) -> None:
        """Stop every process, then remove every actor and the placement group; stop Ray if rl started it."""
        import ray

        if not ray.is_initialized():
            return
        try:
            if self.relay is not None:
                self.relay.stop()  # its last pass carries the trainer's last metrics
            self.stop([*dict.fromkeys(b.process for b in self.bundles), *self.local.procs], grace)
            if self.relay is not None:
                self.collect_logs()
        finally:
            for h in self.hosts:
                ray.kill(h)
            if self.group is not None:
                ray.util.remove_placement_group(self.group)
            ray.shutdown()  # a Ray instance rl started stops with it; a cluster's stays up

    def collect_logs(self) -> None:
        """Copy each placed process's log from its node's run folder to this one's logs/."""
        import ray

        self.run.logs.mkdir(parents=True, exist_ok=True)
        for i, h in enumerate(self.hosts):
            try:
                text, _ = ray.get(h.call.remote(read_lines, f"{self.roots[i]}/logs/{self._log_name(i)}.log", 0))
            except ray.exceptions.RayError as e:
                log.warning("the log of %s stays on its node: %s", self._log_name(i), first_line(e))
                continue
            (self.run.logs / f"{self._log_name(i)}.log").write_bytes(text)
            record_written(self.run.logs / f"{self._log_name(i)}.log")

    def tail(self, name: str, lines: int = 40) -> str:
        import ray

        if not (mine := self._mine(name)):
            return self.local.tail(name, lines)
        failing = next((i for i in mine if self._polls()[i] not in (None, 0)), mine[0])
        try:
            return str(ray.get(self.hosts[failing].tail.remote(self._log_name(failing), lines)))
        except ray.exceptions.RayError as e:
            return f"(its node {self.nodes[failing][0][:12]} is lost: {first_line(e)})\n"
