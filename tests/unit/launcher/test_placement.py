"""Which GPUs, ports and logs each process of an `rl` run gets on one node (launcher/placement.py),
and that the plan hands each child its GPUs through CUDA_VISIBLE_DEVICES. No GPU needed: the number
of GPUs is an argument."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig, RunMode
from lorarl.config.serve import ServeConfig
from lorarl.launcher.placement import Placement, PlacementError, cuda_visible_devices, place, visible_gpus, worker_gpus
from lorarl.launcher.plan import ProcessSpec, plan_run
from lorarl.launcher.preflight import check_environments
from lorarl.run_folder import RunFolder
from tests.conftest import REPO, free_port


def cfg(inference: dict[str, Any] | None = None, dp: int = 1, trainer_gpus: list[int] | None = None,
        **kw: Any) -> RLConfig:  # fmt: skip
    trainer: dict[str, Any] = {"parallel": {"dp": dp}}
    if trainer_gpus is not None:
        trainer["gpu_ids"] = trainer_gpus
    return RLConfig.model_validate({"model": {"name": "m"}, "inference": inference or {}, "trainer": trainer, **kw})


def gpus_of(p: Placement) -> dict[str, tuple[int, ...]]:
    return {s.name: s.gpus for s in p.slots}


# Defaults: the counts are the config's; vLLM takes the first GPUs, the trainer the next ones.


def test_no_gpu_puts_every_process_on_the_cpu() -> None:
    p = place(cfg({"num_workers": 2}, dp=2), 0)
    assert gpus_of(p) == {"inference-0": (), "inference-1": (), "orchestrator": (), "trainer": ()}
    assert [s.devices for s in p.slots] == ["cpu"] * 4 and not p.on_gpu
    assert [s.port for s in p.slots] == ["8000", "8001", "-", "free (torchrun)"]
    assert p.slots[0].log == Path("outputs/default/logs/inference-0.log")


def test_one_gpu_is_refused_unless_colocation_is_asked_for() -> None:
    with pytest.raises(PlacementError, match=r"^1 GPU visible, .* set inference.colocate_with_trainer = true"):
        place(cfg(), 1)
    p = place(cfg({"colocate_with_trainer": True}), 1)
    assert gpus_of(p) == {"inference-0": (0,), "orchestrator": (), "trainer": (0,)}
    assert p.shared == (0,) and p.idle == () and p.memory_fraction == 0.4
    assert "shared by vLLM and the trainer: gpu 0" in p.table() and "takes 0.4 of its memory" in p.table()
    # A fraction the user set is kept, colocated or not.
    assert place(cfg({"colocate_with_trainer": True, "gpu_memory_utilization": 0.3}), 1).memory_fraction == 0.3
    assert place(cfg(), 2).memory_fraction == 0.9


def test_two_gpus_inference_first_then_trainer() -> None:
    p = place(cfg(), 2)
    assert gpus_of(p) == {"inference-0": (0,), "orchestrator": (), "trainer": (1,)}
    assert "2 GPUs (ids as rl sees them, after its CUDA_VISIBLE_DEVICES)" in p.table()
    assert p.shared == p.idle == () and p["trainer"].devices == "gpu 1" and p["orchestrator"].devices == "cpu"


def test_four_gpus_defaults_leave_the_rest_idle_and_say_so() -> None:
    p = place(cfg(), 4)
    assert gpus_of(p)["trainer"] == (1,) and p.idle == (2, 3)
    assert "idle: gpu 2,3 (raise inference.num_workers or trainer.parallel.dp" in p.table()
    p = place(cfg({"num_workers": 2}, dp=2), 4)
    assert gpus_of(p) == {"inference-0": (0,), "inference-1": (1,), "orchestrator": (), "trainer": (2, 3)}
    assert p["trainer"].port == "free (torchrun)" and p.idle == ()


def test_eight_gpus_tensor_parallel_workers_and_dp_ranks() -> None:
    p = place(cfg({"num_workers": 2, "tensor_parallel_size": 2}, dp=4), 8)
    assert gpus_of(p) == {"inference-0": (0, 1), "inference-1": (2, 3), "orchestrator": (), "trainer": (4, 5, 6, 7)}
    assert p["trainer"].devices == "gpu 4-7" and p["inference-1"].devices == "gpu 2,3"
    p = place(cfg({"tensor_parallel_size": 4}), 8)
    assert gpus_of(p)["inference-0"] == (0, 1, 2, 3) and gpus_of(p)["trainer"] == (4,) and p.idle == (5, 6, 7)
    # Colocated: every GPU holds a vLLM worker and a trainer rank.
    p = place(cfg({"num_workers": 8, "colocate_with_trainer": True}, dp=8), 8)
    assert [s.gpus for s in p.slots if s.name.startswith("inference")] == [(g,) for g in range(8)]
    assert p["trainer"].gpus == tuple(range(8)) == p.shared


def test_explicit_gpu_ids() -> None:
    p = place(cfg({"num_workers": 2, "gpu_ids": [7, 6]}, dp=2, trainer_gpus=[0, 3]), 8)
    assert gpus_of(p) == {"inference-0": (7,), "inference-1": (6,), "orchestrator": (), "trainer": (0, 3)}
    assert p.idle == (1, 2, 4, 5)
    # Only the trainer's given: vLLM takes the first GPUs the trainer leaves.
    p = place(cfg({"tensor_parallel_size": 2}, dp=2, trainer_gpus=[0, 1]), 4)
    assert gpus_of(p)["inference-0"] == (2, 3)
    # Only vLLM's given: the trainer takes the first GPUs vLLM leaves.
    assert place(cfg({"gpu_ids": [0, 1], "num_workers": 2}, dp=2), 4)["trainer"].gpus == (2, 3)
    assert place(cfg({"gpu_ids": [2]}, dp=2), 4)["trainer"].gpus == (0, 1)


def test_urls_start_no_worker_and_keep_the_trainer_off_their_gpus() -> None:
    p = place(cfg({"urls": ["http://127.0.0.1:9000"]}), 1)  # the servers are elsewhere
    assert gpus_of(p) == {"orchestrator": (), "trainer": (0,)}
    p = place(cfg({"urls": ["http://127.0.0.1:9000"], "gpu_ids": [0]}), 2)  # started with `lorarl-inference` on gpu 0
    assert p["trainer"].gpus == (1,) and p.external == (0,) and p.idle == ()
    assert "vLLM servers at inference.urls: gpu 0" in p.table()


# Refusals: one line naming the keys.

REFUSED = [
    ({}, 1, "1 GPU visible, but vLLM and the trainer each need GPUs of their own"),
    ({"inference": {"num_workers": 3}, "dp": 2}, 4,
     r"4 GPUs visible: vLLM takes 3 \(inference.num_workers × inference.tensor_parallel_size\) and the trainer "
     r"needs 2 more \(trainer.parallel.dp\), 1 left"),
    ({"inference": {"tensor_parallel_size": 2}}, 2, "vLLM takes 2 .* the trainer needs 1 more"),
    ({"inference": {"num_workers": 2, "tensor_parallel_size": 2}}, 2,
     r"inference.num_workers \(2\) × inference.tensor_parallel_size \(2\) = 4 GPUs for vLLM, but 2 GPUs visible"),
    ({"inference": {"colocate_with_trainer": True}, "dp": 2}, 1, "trainer.parallel.dp = 2 needs 2 GPUs, but 1 GPU"),
    ({"inference": {"gpu_ids": [0]}, "trainer_gpus": [0]}, 2,
     r"trainer.gpu_ids \[0\] and inference.gpu_ids \[0\] share gpu 0: .*inference.colocate_with_trainer = true"),
    ({"trainer_gpus": [0]}, 1, r"= 1 GPU for vLLM, but 1 GPU visible, 0 of them not in trainer.gpu_ids \[0\]"),
    ({"inference": {"urls": ["http://h:1"], "gpu_ids": [1]}, "trainer_gpus": [1]}, 2, "share gpu 1"),
    ({"trainer_gpus": [1, 2]}, 4, r"trainer.gpu_ids = \[1, 2\] lists 2 GPUs, but trainer.parallel.dp = 1"),
    ({"dp": 4, "trainer_gpus": [1, 2]}, 4, "trainer.parallel.dp = 4: one GPU per rank"),
    ({"inference": {"num_workers": 2, "gpu_ids": [0, 1, 2]}}, 8,
     r"inference.gpu_ids = \[0, 1, 2\] lists 3 GPUs, but inference.num_workers \(2\) .* = 2"),
    ({"inference": {"gpu_ids": [8]}}, 8, r"inference.gpu_ids = \[8\]: gpu 8 does not exist, 8 GPUs visible \(0-7\)"),
    ({"dp": 2, "trainer_gpus": [1, 5]}, 4, r"trainer.gpu_ids = \[1, 5\]: gpu 5 does not exist"),
    ({"inference": {"num_workers": 2, "gpu_ids": [3, 3]}}, 4, "lists gpu 3 more than once: each vLLM worker"),
    ({"dp": 2, "trainer_gpus": [2, 2]}, 4, "trainer.gpu_ids = .* lists gpu 2 more than once: each trainer rank"),
    ({"inference": {"gpu_ids": [0]}}, 0, "inference.gpu_ids = .*, but this machine has no GPU"),
    ({"trainer_gpus": [0]}, 0, "trainer.gpu_ids = .*, but this machine has no GPU"),
]  # fmt: skip


@pytest.mark.parametrize(("kw", "gpus", "message"), REFUSED, ids=[f"{g}gpu-{i}" for i, (_, g, _) in enumerate(REFUSED)])
def test_a_placement_that_cannot_work_is_refused_in_one_line(kw: dict[str, Any], gpus: int, message: str) -> None:
    with pytest.raises(PlacementError, match=message) as e:
        place(cfg(**kw), gpus)
    assert "\n" not in str(e.value)


def test_dry_run_devices_only_in_a_dry_run() -> None:
    with pytest.raises(ValidationError, match="dry_run_devices only pretends for a dry run"):
        RunMode(dry_run_devices=8)
    assert visible_gpus(RunMode(dry_run=True, dry_run_devices=8)) == 8


# The plan: each child's CUDA_VISIBLE_DEVICES, the resolved configs, placement.txt.


def plan(c: RLConfig, gpus: int, tmp_path: Path, pretended: bool = False) -> dict[str, ProcessSpec]:
    c = c.model_copy(update={"output_dir": tmp_path})
    return {s.name: s for s in plan_run(c, RunFolder(c.run_dir), place(c, gpus, pretended))}


def test_the_plan_gives_each_child_its_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    specs = plan(cfg({"num_workers": 2, "tensor_parallel_size": 2}, dp=4), 8, tmp_path)
    assert specs["inference-0"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert specs["inference-1"].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "VLLM_CPU_KVCACHE_SPACE" not in specs["inference-0"].env
    assert "--tensor-parallel-size 2" in specs["inference-1"].shell() and "--port 8001" in specs["inference-1"].shell()
    # The trainer's 4 ranks see cuda:0..3 (LOCAL_RANK picks one) = GPUs 4-7.
    assert specs["trainer"].env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert "--standalone --nproc-per-node=4" in specs["trainer"].shell()
    assert "CUDA_VISIBLE_DEVICES" not in specs["orchestrator"].env
    configs = tmp_path / "default" / "configs"
    assert json.loads((configs / "inference.json").read_text())["inference"]["gpu_ids"] == [0, 1, 2, 3]
    trainer = load_config(RLConfig, ["@", str(configs / "trainer.json")])
    assert trainer.trainer.gpu_ids == [4, 5, 6, 7] and trainer.trainer.num_threads is None  # GPU: torch's threads
    assert (configs / "placement.txt").read_text() == place(cfg({"num_workers": 2, "tensor_parallel_size": 2}, dp=4,
        output_dir=tmp_path), 8).table()  # fmt: skip
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7 " in (configs / "commands.txt").read_text()


def test_colocated_children_share_gpu_0_and_vllm_takes_less(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    specs = plan(cfg({"colocate_with_trainer": True}), 1, tmp_path)
    assert specs["inference-0"].env["CUDA_VISIBLE_DEVICES"] == specs["trainer"].env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "--gpu-memory-utilization 0.4" in specs["inference-0"].shell()


def test_gpu_ids_select_among_the_gpus_rl_sees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rl started with CUDA_VISIBLE_DEVICES=4,5,6,7 sees 4 GPUs: its gpu 1 is the machine's GPU 5."""
    assert cuda_visible_devices((0, 2), None) == "0,2"
    assert cuda_visible_devices((1,), "GPU-aaa, GPU-bbb") == "GPU-bbb"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    names = ("inference-0", "inference-1", "trainer")
    specs = plan(cfg({"num_workers": 2}, dp=2), 4, tmp_path)
    assert [specs[n].env["CUDA_VISIBLE_DEVICES"] for n in names] == ["4", "5", "6,7"]
    # A dry run's pretended GPUs are not this machine's.
    specs = plan(cfg({"num_workers": 2}, dp=2), 4, tmp_path, pretended=True)
    assert [specs[n].env["CUDA_VISIBLE_DEVICES"] for n in names] == ["0", "1", "2,3"]


def test_inference_alone_takes_the_gpus_rl_would_give_the_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c, pretend = cfg({"num_workers": 2, "tensor_parallel_size": 2}), RunMode(dry_run=True, dry_run_devices=8)
    assert worker_gpus(c, pretend, 1) == "2,3"
    with pytest.raises(PlacementError, match="--worker 2: inference.num_workers = 2 has workers 0-1"):
        worker_gpus(c, pretend, 2)
    from lorarl.cli import inference
    from lorarl.tiny_model import save_tiny_model

    model = save_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2)  # its dry run checks the model
    inference.main(["--model.name", str(model), "--inference.num_workers", "2", "--trainer.gpu_ids", "[0]",
                    "--dry-run", "--dry-run-devices", "4", "--worker", "1"])  # fmt: skip
    assert capsys.readouterr().out.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True CUDA_VISIBLE_DEVICES=2 ")


def test_rl_dry_run_prints_the_placement_for_pretended_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lorarl.cli import rl
    from lorarl.tiny_model import save_tiny_model

    model = save_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2)
    argv = ["--model.name", str(model), "--output_dir", str(tmp_path), "--run_name", "r",
            "--inference.port", str(free_port(2)), "--inference.num_workers", "2", "--trainer.parallel.dp", "2",
            "--dry-run", "--dry-run-devices", "4"]  # fmt: skip
    rl.main(argv)
    out = capsys.readouterr().out
    table = (tmp_path / "r" / "configs" / "placement.txt").read_text()
    assert out.startswith(table) and out.index("# inference-0") > len(table)
    assert re.search(r"^trainer +local +gpu 2,3 +free \(torchrun\) +\S+/r/logs/trainer.log$", table, re.M), table
    assert "4 GPUs (as --dry-run-devices pretends)" in table
    with pytest.raises(SystemExit) as e:
        rl.main([*argv[:-1], "1"])
    assert e.value.code == 2 and "= 2 GPUs for vLLM, but 1 GPU visible: lower" in capsys.readouterr().err


# The shipped GPU recipes: each places on the GPUs its name says, using all of them.

GPU_CONFIGS = sorted((REPO / "configs" / "gpu").rglob("*.toml"))


def test_gpu_recipes_are_shipped() -> None:
    names = {str(p.relative_to(REPO / "configs" / "gpu")) for p in GPU_CONFIGS}
    for env in ("reverse_text", "alphabet_sort", "unscramble", "math", "search"):
        assert f"{env}/8gpu.toml" in names, names


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_gpu_recipe_places_on_its_gpus(path: Path) -> None:
    match = re.fullmatch(r"(\d+)gpu", path.stem)
    assert match, f"{path.name}: name GPU recipes <N>gpu.toml, N the GPUs it is sized for"
    gpus = int(match.group(1))
    serve = "serve" in path.relative_to(REPO).parts  # lorarl-serve's recipes: no environments
    c = load_config(ServeConfig if serve else RLConfig, ["@", str(path)])
    p = place(c, gpus)
    assert p.idle == (), f"{path.name} leaves gpu {p.idle} idle"
    assert bool(p.shared) == c.inference.colocate_with_trainer
    assert c.model.dtype == "bfloat16"
    if isinstance(c, RLConfig):
        check_environments(c)  # the environments take their args (rl's own check, short of the hub model)
