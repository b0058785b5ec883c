"""The Ray placement group of a run, its table, and what the plan makes of the nodes Ray picked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lorarl.config.run import RLConfig
from lorarl.config.serve import ServeConfig
from lorarl.inference.server import CPU_LORA_EXTENSION
from lorarl.launcher.plan import plan_run
from lorarl.launcher.preflight import PreflightError, check_cluster
from lorarl.launcher.ray_bundles import plan_bundles, ray_placement
from lorarl.launcher.serve import plan_serve
from lorarl.run_folder import RunFolder
from lorarl.serve.folder import ServeFolder
from lorarl.serve.rpc import HOST_ENV


def cfg(tmp_path: Path, cluster: dict[str, Any] | None = None, **kw: Any) -> RLConfig:
    return RLConfig.model_validate({
        "model": {"name": "m"}, "output_dir": str(tmp_path), "inference": {"api_key": "k", **kw.pop("inference", {})},
        "cluster": {"backend": "ray", **(cluster or {})}, **kw,
    })  # fmt: skip


def test_one_bundle_per_worker_and_rank_with_the_roles_resources(tmp_path: Path) -> None:
    c = cfg(tmp_path, {"trainer_resources": {"big": 1}}, inference={"num_workers": 2, "tensor_parallel_size": 4},
            trainer={"parallel": {"dp": 2}})  # fmt: skip
    on_gpus = plan_bundles(c, gpus=True)
    assert [(b.process, b.rank, b.resources) for b in on_gpus] == [
        ("inference-0", 0, {"CPU": 1, "GPU": 4}),
        ("inference-1", 0, {"CPU": 1, "GPU": 4}),
        ("trainer", 0, {"CPU": 1, "GPU": 1, "big": 1}),
        ("trainer", 1, {"CPU": 1, "GPU": 1, "big": 1}),
    ]
    assert [b.resources for b in plan_bundles(c, gpus=False)][0] == {"CPU": 1}
    urls = cfg(tmp_path, inference={"urls": ["http://h:1"]})
    assert [b.process for b in plan_bundles(urls, gpus=False)] == ["trainer"]


def test_the_table_before_and_after_ray_placed_the_bundles(tmp_path: Path) -> None:
    c = cfg(tmp_path, inference={"port": 9000}, trainer={"parallel": {"dp": 2}})
    bundles = plan_bundles(c, gpus=True)
    before = ray_placement(c, bundles)
    assert [(s.name, s.node) for s in before.slots] == [("inference-0", "ray"), ("orchestrator", "local"),
                                                         ("trainer", "ray")]  # fmt: skip
    assert before.worker_hosts() is None and "Ray picks the nodes" in before.table()
    nodes = [("a" * 40, "10.0.0.1"), ("b" * 40, "10.0.0.2"), ("c" * 40, "10.0.0.3")]
    after = ray_placement(c, bundles, nodes)
    assert after["inference-0"].node == "a" * 12 and after["inference-0"].port == "10.0.0.1:9000"
    assert after["trainer"].node == f"{'b' * 12},{'c' * 12}"  # rank 1 did not fit on rank 0's node
    assert after.worker_hosts() == ["10.0.0.1"]


def test_the_plan_points_the_orchestrator_at_the_placed_workers(tmp_path: Path) -> None:
    c = cfg(tmp_path, inference={"port": 9000}, trainer={"parallel": {"dp": 2}})
    run = RunFolder(c.run_dir)
    placement = ray_placement(c, plan_bundles(c, gpus=False), [("a" * 40, "10.0.0.1"), ("b" * 40, "10.0.0.2")] * 2)
    specs = {s.name: s for s in plan_run(c, run, placement)}
    assert "--host 10.0.0.1 --port 9000" in " ".join(specs["inference-0"].cmd)
    orchestrator = json.loads((run.configs / "orchestrator.json").read_text())
    assert orchestrator["inference"]["urls"] == ["http://10.0.0.1:9000"]
    assert json.loads((run.configs / "inference.json").read_text())["inference"]["urls"] == []
    # Each rank is a process of its own in its bundle: no torchrun, and no thread count from this machine.
    assert "torch.distributed.run" not in specs["trainer"].cmd
    assert json.loads((run.configs / "trainer.json").read_text())["trainer"]["num_threads"] is None


def test_lorarl_serve_keeps_its_api_here_and_listens_at_the_nodes_ray_picked(tmp_path: Path) -> None:
    """The API stays where lorarl-serve runs; the worker and the trainer listen on their nodes' addresses,
    the trainer on the port found free there, and the API reaches them there."""
    c = ServeConfig.model_validate({
        "model": {"name": "m"}, "output_dir": str(tmp_path), "inference": {"api_key": "k", "port": 9000},
        "cluster": {"backend": "ray"},
    })  # fmt: skip
    bundles = plan_bundles(c, gpus=False)
    assert [b.process for b in bundles] == ["inference-0", "trainer"]
    placement = ray_placement(c, bundles, [("a" * 40, "10.0.0.1"), ("b" * 40, "10.0.0.2")])
    assert [(s.name, s.node) for s in placement.slots] == [("inference-0", "a" * 12), ("api", "local"),
                                                            ("trainer", "b" * 12)]  # fmt: skip
    specs = {s.name: s for s in plan_serve(c, ServeFolder(c.run_dir), placement, trainer_port=4321)}
    assert "--host 10.0.0.1 --port 9000" in " ".join(specs["inference-0"].cmd)
    assert specs["trainer"].env[HOST_ENV] == "10.0.0.2"
    trainer = json.loads((c.run_dir / "configs" / "trainer.json").read_text())
    assert trainer["serve"]["trainer_port"] == 4321 and trainer["trainer"]["num_threads"] is None


@pytest.mark.parametrize("gpus", [True, False])
def test_vllm_on_gpu_bundles_is_started_for_gpus_and_on_cpu_bundles_for_a_cpu(tmp_path: Path, gpus: bool) -> None:
    """Ray gives each bundle its devices, so this machine's GPUs say nothing: the bundles do. A worker
    on a GPU node was pinned to this machine's cores and given the CPU LoRA ops."""
    nodes = [("a" * 40, "10.0.0.1"), ("b" * 40, "10.0.0.2")]
    c = cfg(tmp_path, inference={"tensor_parallel_size": 2})
    placement = ray_placement(c, plan_bundles(c, gpus=gpus), nodes)
    assert placement.device_gpus == (3 if gpus else 0) and not placement.on_gpu  # no CUDA_VISIBLE_DEVICES here
    s = ServeConfig.model_validate({
        "model": {"name": "m"}, "output_dir": str(tmp_path / "s"), "cluster": {"backend": "ray"},
        "inference": {"api_key": "k", "port": 9000},
    })  # fmt: skip
    served = ray_placement(s, plan_bundles(s, gpus=gpus), nodes)
    workers = [plan_run(c, RunFolder(c.run_dir), placement)[0],
               plan_serve(s, ServeFolder(s.run_dir), served, trainer_port=4321)[0]]  # fmt: skip
    commands = [" ".join(w.cmd) for w in workers]
    for worker, cmd in zip(workers, commands, strict=True):
        cpu_only = ("lorarl.cpu.cores", CPU_LORA_EXTENSION)
        assert [part in cmd for part in cpu_only] == [not gpus] * 2, cmd
        assert ("VLLM_CPU_KVCACHE_SPACE" in worker.env) == (not gpus)  # Ray sets the GPUs' devices
        assert "CUDA_VISIBLE_DEVICES" not in worker.env
    assert ("--no-enable-chunked-prefill" in commands[1]) == (not gpus)


@pytest.mark.parametrize(
    ("cluster", "kw", "message"),
    [
        ({"address": "nowhere"}, {}, "cluster.address 'nowhere'"),
        ({}, {"inference": {"api_key": None}}, "inference.api_key is required"),
        ({}, {"trainer": {"gpu_ids": [0]}}, "trainer.gpu_ids = [0]: with cluster.backend"),
        ({}, {"inference": {"colocate_with_trainer": True}}, "inference.colocate_with_trainer"),
        ({"backend": "local", "address": "auto"}, {}, "cluster.address is for cluster.backend"),
        ({"backend": "local", "shared_fs": False}, {}, "cluster.shared_fs = false is for"),
    ],
)
def test_cluster_settings_that_cannot_work_are_refused_in_one_line(
    tmp_path: Path, cluster: dict[str, Any], kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(PreflightError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")) as e:
        check_cluster(cfg(tmp_path, cluster, **kw))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("address", [None, "auto", "10.0.0.1:6379", "ray://head.example.com:10001"])
def test_ray_addresses_accepted(tmp_path: Path, address: str | None) -> None:
    check_cluster(cfg(tmp_path, {"address": address}))
