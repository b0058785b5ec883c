"""`rl` on a real multi-node Ray cluster in one box (`ray.cluster_utils.Cluster`): the trainer and
the vLLM worker are pinned to different nodes through custom resources (cluster.trainer_resources,
cluster.inference_resources), as node labels would on a real cluster."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import free_port
from tests.integration.helpers import rl_command, rl_config, run_rl, steps_logged, wait_for_trainer_steps, write_config

pytestmark = pytest.mark.integration


class Nodes:
    def __init__(self, address: str, trainer: str, inference: str) -> None:
        self.address, self.trainer, self.inference = address, trainer, inference


@pytest.fixture(scope="module")
def ray_nodes() -> Iterator[Nodes]:
    """A head without room for any bundle, a trainer node and an inference node."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    trainer = cluster.add_node(num_cpus=2, resources={"trainer_node": 1})
    inference = cluster.add_node(num_cpus=2, resources={"inference_node": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)  # the tests look at what the run left behind
    try:
        yield Nodes(cluster.address, trainer.node_id, inference.node_id)
    finally:
        ray.shutdown()
        cluster.shutdown()


def ray_config(tiny_model: Path, tmp_path: Path, nodes: Nodes, run_name: str, **overrides: Any) -> Path:
    cfg = rl_config(tiny_model, tmp_path, run_name, **{"inference.port": free_port()}, **overrides)
    cfg["cluster"] = {
        "backend": "ray",
        "address": nodes.address,
        "trainer_resources": {"trainer_node": 1},
        "inference_resources": {"inference_node": 1},
    }
    return write_config(cfg, tmp_path / f"{run_name}.json")


def placed_nodes(run: Path) -> dict[str, str]:
    """process -> node id (as placement.txt shortens it)."""
    rows = (run / "configs" / "placement.txt").read_text().splitlines()[1:]
    return {r.split()[0]: r.split()[1] for r in rows if r.split()[0] in ("inference-0", "trainer", "orchestrator")}


def assert_nothing_left_on_ray() -> None:
    """No placement group of the run is alive and every resource is free again (no actor holds any)."""
    import ray

    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
    assert ray.available_resources() == ray.cluster_resources()


def test_trainer_and_vllm_on_different_nodes(tiny_model: Path, tmp_path: Path, ray_nodes: Nodes) -> None:
    result = run_rl(ray_config(tiny_model, tmp_path, ray_nodes, "nodes"), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "nodes"
    assert steps_logged(run, "trainer") == [1, 2, 3]
    placed = placed_nodes(run)
    assert placed["trainer"] == ray_nodes.trainer[:12]
    assert placed["inference-0"] == ray_nodes.inference[:12]
    assert placed["orchestrator"] == "local"
    # The orchestrator reached vLLM at the address Ray reported for its node, and loaded every version.
    vllm_log = (run / "logs" / "inference-0.log").read_text()
    assert "Loaded new LoRA adapter: name 'nodes-step3'" in vllm_log
    assert_nothing_left_on_ray()


def test_sigint_leaves_no_actor_placement_group_or_process(tiny_model: Path, tmp_path: Path, ray_nodes: Nodes) -> None:
    config = ray_config(tiny_model, tmp_path, ray_nodes, "sigint", max_steps=1000)
    proc = subprocess.Popen(rl_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "sigint"
    try:
        wait_for_trainer_steps(proc, run, 1)
        # The placed processes are children of Ray's workers, not of rl: found by their commands.
        placed = [p for p in psutil.process_iter(["cmdline"]) if str(run / "configs") in " ".join(p.info["cmdline"] or [])
                  or (f"--port {config_port(config)}" in " ".join(p.info["cmdline"] or []))]  # fmt: skip
        tree = [q for p in placed for q in [p, *p.children(recursive=True)]]
        names = " ".join(" ".join(p.cmdline()) for p in tree)
        assert "vllm" in names and "lorarl.cli.trainer" in names
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    assert_nothing_left_on_ray()


def config_port(config: Path) -> int:
    import json

    return int(json.loads(config.read_text())["inference"]["port"])
