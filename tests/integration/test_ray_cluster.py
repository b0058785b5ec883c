"""`rl` and `lorarl-serve` on a real multi-node Ray cluster in one box (`ray.cluster_utils.Cluster`): the
trainer and the vLLM worker are pinned to different nodes through custom resources
(cluster.trainer_resources, cluster.inference_resources), as node labels would on a real cluster."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from tinker import types

from tests.conftest import API_KEY, free_port
from tests.integration.helpers import rl_command, rl_config, run_rl, steps_logged, wait_for_trainer_steps, write_config
from tests.integration.serve.conftest import running_server, serve_config
from tests.integration.serve.test_sdk import batch, train

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


def on_the_nodes(nodes: Nodes) -> dict[str, Any]:
    """[cluster]: the trainer on the trainer node, the vLLM worker on the inference node."""
    return {
        "backend": "ray",
        "address": nodes.address,
        "trainer_resources": {"trainer_node": 1},
        "inference_resources": {"inference_node": 1},
    }


def ray_config(tiny_model: Path, tmp_path: Path, nodes: Nodes, run_name: str, **overrides: Any) -> Path:
    cfg = rl_config(tiny_model, tmp_path, run_name, **{"inference.port": free_port()}, **overrides)
    cfg["cluster"] = on_the_nodes(nodes) | cfg.get("cluster", {})
    return write_config(cfg, tmp_path / f"{run_name}.json")


def placed_nodes(run: Path) -> dict[str, str]:
    """process -> node id (as placement.txt shortens it)."""
    rows = (run / "configs" / "placement.txt").read_text().splitlines()[1:]
    names = ("inference-0", "trainer", "orchestrator", "api")
    return {r.split()[0]: r.split()[1] for r in rows if r.split()[0] in names}


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


def test_without_a_shared_folder_then_sigint(tiny_model: Path, tmp_path: Path, ray_nodes: Nodes) -> None:
    """cluster.shared_fs = false: each node has a folder of its own (distinct paths here: they hold the
    node id), adapters and batches travel through Ray's object store, and the vLLM worker loads every
    adapter from its node's folder only. Then Ctrl-C: no actor, placement group or process is left."""
    node_dir = tmp_path / "node-local"
    config = ray_config(tiny_model, tmp_path, ray_nodes, "apart", max_steps=1000,
                        **{"cluster.shared_fs": False, "cluster.node_dir": str(node_dir)})  # fmt: skip
    port = json.loads(config.read_text())["inference"]["port"]
    proc = subprocess.Popen(rl_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "apart"
    trainer_root, inference_root = node_dir / ray_nodes.trainer / "apart", node_dir / ray_nodes.inference / "apart"
    try:
        wait_for_trainer_steps(proc, run, 3)  # the trainer's metrics reach the run folder
        # The adapters arrived on the inference node as PEFT folders; its vLLM loaded them from there.
        shipped = sorted(inference_root.glob("broadcasts/step_*/STABLE"))
        assert shipped and (shipped[-1].parent / "adapter_config.json").is_file()
        vllm_log = (inference_root / "logs" / "inference-0.log").read_text()
        assert f"name 'apart-step2', path '{inference_root}/broadcasts/step_2'" in vllm_log
        assert str(trainer_root) not in vllm_log and str(run) not in vllm_log
        trainer_log = (trainer_root / "logs" / "trainer.log").read_text()
        assert f"wrote the starting adapter to {trainer_root}/broadcasts/step_0" in trainer_log
        assert not (run / "logs" / "trainer.log").exists()  # copied here only when the run ends
        # The placed processes are children of Ray's workers, not of rl: found by their commands.
        tree = [q for p in psutil.process_iter(["cmdline"]) if is_placed(p.info["cmdline"], run, trainer_root, port)
                for q in [p, *p.children(recursive=True)]]  # fmt: skip
        names = " ".join(" ".join(p.cmdline()) for p in tree)
        assert "vllm" in names and "lorarl.cli.trainer" in names and "lorarl.cli.orchestrator" in names
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    assert_nothing_left_on_ray()
    assert "step" in (run / "logs" / "trainer.log").read_text()  # each node's log, copied back


def is_placed(cmdline: list[str] | None, run: Path, trainer_root: Path, port: int) -> bool:
    line = " ".join(cmdline or [])
    return str(run / "configs") in line or str(trainer_root / "configs") in line or f"--port {port} " in line


def test_bundles_the_cluster_cannot_grant_stop_the_run_and_leave_nothing(
    tiny_model: Path, tmp_path: Path, ray_nodes: Nodes
) -> None:
    config = ray_config(tiny_model, tmp_path, ray_nodes, "unplaced", **{"cluster.placement_timeout": 3,
                        "cluster.trainer_resources": {"no_such_node": 1}})  # fmt: skip
    result = run_rl(config, timeout=120)
    assert result.returncode == 1
    assert "cluster.placement_timeout" in result.stderr and "trainer {CPU: 1, no_such_node: 1}" in result.stderr
    assert_nothing_left_on_ray()


def test_a_failing_placed_process_stops_the_run_with_its_log_tail(
    tiny_model: Path, tmp_path: Path, ray_nodes: Nodes
) -> None:
    config = ray_config(tiny_model, tmp_path, ray_nodes, "fails", **{"inference.extra_args": ["--no-such-flag"]})
    result = run_rl(config, timeout=300)
    assert result.returncode == 1
    assert "inference-0 exited with code" in result.stderr and "--no-such-flag" in result.stderr  # its log's tail
    assert_nothing_left_on_ray()


def test_lorarl_serve_places_its_trainer_and_vllm_on_the_nodes_and_the_sdk_trains_and_samples(
    tiny_model: Path, tmp_path: Path, ray_nodes: Nodes
) -> None:
    """The API where lorarl-serve runs reaches the trainer and the vLLM worker at their nodes' addresses;
    the stock SDK trains and samples through them; SIGTERM leaves no process and no bundle."""
    config = serve_config(tiny_model, tmp_path, "serve-ray")
    cfg = json.loads(config.read_text())
    cfg["inference"]["api_key"] = API_KEY
    cfg["cluster"] = on_the_nodes(ray_nodes)
    config.write_text(json.dumps(cfg))
    with running_server(config, timeout=400) as server:
        placed = placed_nodes(server.run_dir)
        assert placed == {"inference-0": ray_nodes.inference[:12], "api": "local", "trainer": ray_nodes.trainer[:12]}
        service = server.client()
        base = service.get_server_capabilities().supported_models[0].model_name
        client = service.create_lora_training_client(base_model=base, rank=8, seed=1).result()
        losses = train(client, batch(0), steps=4)
        assert losses[-1] < losses[0], losses
        sampler = client.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
        result = sampler.sample(types.ModelInput.from_ints([11, 12, 13]), 2, params).result()
        assert len(result.sequences) == 2 and all(1 <= len(s.tokens) <= 4 for s in result.sequences)
        placed_processes = [
            p for p in psutil.process_iter(["cmdline"])
            if is_placed(p.info["cmdline"], server.run_dir, server.run_dir, cfg["inference"]["port"])
        ]  # fmt: skip
        assert len(placed_processes) >= 2  # the trainer and vLLM, children of the nodes' Ray workers
    assert server.proc.returncode == 143  # SIGTERM, as Ctrl-C's 130
    assert "placing the server on Ray" in (server.run_dir / "logs" / "serve.log").read_text()  # the API's log
    gone, alive = psutil.wait_procs(placed_processes, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
    assert_nothing_left_on_ray()
