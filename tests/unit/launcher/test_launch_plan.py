import json
import os
from pathlib import Path

import pytest

from lorarl.config.run import RLConfig
from lorarl.inference.server import vllm_env, vllm_max_lora_rank, worker_urls
from lorarl.launcher.placement import place
from lorarl.launcher.plan import plan_run, worker_command
from lorarl.launcher.preflight import check_adapter_slots
from lorarl.run_folder import RunFolder
from lorarl.trainer.model import check_init_adapter


@pytest.mark.parametrize(("rank", "expected"), [(1, 1), (2, 8), (8, 8), (9, 16), (100, 128), (300, 320)])
def test_lora_rank_rounds_up_to_a_rank_vllm_accepts(rank: int, expected: int) -> None:
    assert vllm_max_lora_rank(rank) == expected


# malloc's policy for CPU workers (cpu/host_memory.py): keep what a step frees, or return it.
KEEP = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647"}
RETURN = "glibc.malloc.mmap_threshold=131072"


@pytest.fixture(autouse=True)
def _no_malloc_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)


def cfg(tmp_path: Path, **kw) -> RLConfig:
    return RLConfig.model_validate({"model": {"name": "m", "lora": {"rank": 12}}, "output_dir": str(tmp_path), **kw})


def test_vllm_command_derives_lora_flags_from_the_config(tmp_path: Path) -> None:
    c = cfg(tmp_path, orchestrator={"max_async_level": 2}, inference={"port": 9000, "num_workers": 2})
    cmd = " ".join(worker_command(c, 0, worker=1))
    assert "--max-lora-rank 16" in cmd
    assert "--max-loras 4" in cmd  # versions in flight (3) + the next one
    assert "--port 9001" in cmd
    assert "--logprobs-mode processed_logprobs" in cmd
    assert "--tensor-parallel-size 1 --gpu-memory-utilization 0.9" in cmd
    assert vllm_env(c) == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "1", **KEEP}
    assert vllm_env(c.model_copy(update={"keep_freed_memory": False}))["GLIBC_TUNABLES"] == RETURN
    assert vllm_env(c, "2,3") == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert worker_urls(c) == ["http://127.0.0.1:9000", "http://127.0.0.1:9001"]


def test_cpu_workers_serve_adapters_with_lorarls_cpu_lora_ops_and_gpu_workers_with_vllms(tmp_path: Path) -> None:
    extension = ["--worker-extension-cls", "lorarl.cpu.lora_ops.CpuLoRA"]
    cpu = worker_command(cfg(tmp_path), 0)
    assert cpu[cpu.index("--worker-extension-cls") :][:2] == extension
    assert "--worker-extension-cls" not in worker_command(cfg(tmp_path), 2)


def test_full_finetune_starts_workers_that_reload_weights_and_serve_no_adapter(tmp_path: Path) -> None:
    c = RLConfig.model_validate({"model": {"name": "m", "full_finetune": True}, "output_dir": str(tmp_path)})
    cmd = worker_command(c, 2)
    assert "--enable-lora" not in cmd and "--max-lora-rank" not in cmd and "--max-loras" not in cmd
    extension = cmd[cmd.index("--worker-extension-cls") + 1]
    assert extension == "lorarl.inference.weight_reload.WeightReload"
    # vLLM takes one extension: on a CPU too, weight reloading's, not cpu_lora's besides.
    on_cpu = worker_command(c, 0)
    assert on_cpu.count("--worker-extension-cls") == 1 and extension in on_cpu
    # The endpoints the orchestrator reloads weights through (/collective_rpc, /reset_prefix_cache).
    assert vllm_env(c) == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", **KEEP}
    assert c.model.lora is None


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"model": {"name": "m", "full_finetune": True, "lora": {"rank": 4}}}, "has no adapter to set: drop one"),
        ({"variants": [{"name": "a"}]}, "model.full_finetune trains no adapter"),
        ({"trainer": {"loss": {"kl_coef": 0.1}}}, "kl_coef > 0 needs the base model beside the policy"),
    ],
)
def test_full_finetune_refuses_what_needs_an_adapter(extra: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        RLConfig.model_validate({"model": {"name": "m", "full_finetune": True}, **extra})


def test_plan_writes_per_process_configs_and_commands(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    run = RunFolder(c.run_dir)
    specs = plan_run(c, run, place(c, 0))
    assert [s.name for s in specs] == ["inference-0", "orchestrator", "trainer"]
    assert (run.configs / "commands.txt").read_text().count("\n# ") == 2
    placement = (run.configs / "placement.txt").read_text()
    assert "no GPU: every process on the CPU; vLLM workers on cores of their own" in placement
    assert all("CUDA_VISIBLE_DEVICES" not in s.env for s in specs)
    # Each process's config reproduces the resolved values it reads.
    from lorarl.config.loader import load_config

    trainer = load_config(RLConfig, ["@", str(run.configs / "trainer.json")])
    assert trainer.lora.rank == 12 and trainer.trainer.optim == c.trainer.optim
    # rl starts CPU vLLM workers here: the trainer leaves their cores to them.
    cores = sorted(os.sched_getaffinity(0))
    assert trainer.trainer.num_threads == max(1, len(cores) - 1)
    inference = load_config(RLConfig, ["@", str(run.configs / "inference.json")])
    assert inference.inference.time_share is False
    assert c.trainer.num_threads is None and c.inference.time_share is None  # the user's object is not modified
    # Taking turns: the worker and the trainer each get every core.
    turns = cfg(tmp_path, inference={"time_share": True})
    specs = plan_run(turns, run, place(turns, 0))
    assert specs[0].cmd[3] == ",".join(map(str, cores))  # the worker's cores (VLLM_CPU_OMP_THREADS_BIND)
    trainer = load_config(RLConfig, ["@", str(run.configs / "trainer.json")])
    assert trainer.trainer.num_threads == len(cores)
    assert "vLLM and the trainer take turns on every core" in (run.configs / "placement.txt").read_text()


def test_taking_turns_by_default_where_the_trainer_shares_gpus(tmp_path: Path) -> None:
    assert not place(cfg(tmp_path), 0).time_share  # CPU: split measured as fast or faster
    assert not place(cfg(tmp_path), 2).time_share  # GPUs of their own
    colocated = cfg(tmp_path, inference={"colocate_with_trainer": True})
    assert place(colocated, 1).time_share
    assert "they take turns (inference.time_share)" in place(colocated, 1).table()
    assert not place(cfg(tmp_path, inference={"colocate_with_trainer": True, "time_share": False}), 1).time_share
    assert place(cfg(tmp_path, inference={"urls": ["http://h:1"], "time_share": True}), 0).time_share  # asked for


def test_given_urls_mean_no_inference_process(tmp_path: Path) -> None:
    c = cfg(tmp_path, inference={"urls": ["http://h:1"]})
    assert [s.name for s in plan_run(c, RunFolder(c.run_dir), place(c, 0))] == ["orchestrator", "trainer"]


def test_rl_always_trains_lora_and_checks_the_init_adapter(tmp_path: Path) -> None:
    c = RLConfig.model_validate({"model": {"name": "m"}})
    assert c.lora.rank == 8
    (tmp_path / "adapter_config.json").write_text('{"r": 16, "lora_alpha": 16, "use_rslora": false}')
    c.lora.init_adapter = tmp_path
    with pytest.raises(ValueError, match="has r=16, but \\[model.lora\\] says 8"):
        check_init_adapter(c.lora)


def test_a_user_max_loras_must_hold_every_version_in_flight(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sets --max-loras 2, but rollouts may lag 1 versions"):
        check_adapter_slots(cfg(tmp_path, inference={"extra_args": ["--max-loras", "2"]}))
    c = cfg(tmp_path, inference={"extra_args": ["--max-loras", "6"]})
    assert worker_command(c, 0).count("--max-loras") == 1 and "6" in worker_command(c, 0)
    # Continuous batching keeps versions up to max_off_policy_steps old in flight.
    with pytest.raises(ValueError, match="sets --max-loras 4, but rollouts may lag 3 versions"):
        check_adapter_slots(
            cfg(tmp_path, orchestrator={"max_off_policy_steps": 3}, inference={"extra_args": ["--max-loras", "4"]})
        )
    assert "--max-loras 5" in " ".join(worker_command(cfg(tmp_path, orchestrator={"max_off_policy_steps": 3}), 0))


def test_max_off_policy_steps_cannot_drop_groups_sampled_ahead_on_purpose(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"max_off_policy_steps \(1\) < max_async_level \(2\)"):
        cfg(tmp_path, orchestrator={"max_async_level": 2, "max_off_policy_steps": 1})
    assert (
        cfg(tmp_path, orchestrator={"max_async_level": 2, "max_off_policy_steps": 2}).orchestrator.max_policy_lag == 2
    )
    assert cfg(tmp_path, orchestrator={"max_async_level": 2}).orchestrator.max_policy_lag == 2


def test_a_sweep_starts_vllm_for_its_largest_rank_and_every_variants_adapters(tmp_path: Path) -> None:
    variants = [{"name": n, "model": {"lora": {"rank": r}}} for n, r in (("r1", 1), ("r4", 4), ("r64", 64))]
    c = cfg(tmp_path, orchestrator={"max_async_level": 2}, variants=variants)
    cmd = " ".join(worker_command(c, 0))
    assert "--max-lora-rank 64" in cmd
    assert "--max-loras 12" in cmd  # 4 versions each (see above), for 3 variants
    flag = {"extra_args": ["--max-loras=6"]}
    with pytest.raises(ValueError, match="sets --max-loras 6, but .* for each of 3 variants, so 12"):
        check_adapter_slots(cfg(tmp_path, orchestrator={"max_async_level": 2}, inference=flag, variants=variants))
    run = RunFolder(tmp_path / "default").create()
    plan_run(c, run, place(c, 0))
    for role in ("trainer", "orchestrator", "inference"):  # each process resolves the variants itself
        written = json.loads((run.configs / f"{role}.json").read_text())
        assert [v["name"] for v in written["variants"]] == ["r1", "r4", "r64"]
