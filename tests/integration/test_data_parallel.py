"""Data parallel: two CPU ranks (torchrun, gloo) give the same adapter as one process, also with
their weights sharded (fsdp), whose checkpoints resume with or without it."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from lorarl.launcher.plan import torchrun
from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder
from tests.integration.helpers import console_script, metrics, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration


def write_batch(run: RunFolder) -> None:
    rng = random.Random(0)
    rollouts = []
    for _ in range(7):  # odd: the ranks get unequal shares
        n = rng.randint(2, 9)
        rollouts.append(Rollout(
            prompt_ids=[rng.randrange(3, 250) for _ in range(5)],
            completion_ids=[rng.randrange(3, 250) for _ in range(n)],
            completion_logprobs=[-rng.uniform(2, 7) for _ in range(n)],
            completion_mask=[True] * n,
            advantage=rng.uniform(-1, 1), reward=0.0, policy_version=0, temperature=0.8,
        ))  # fmt: skip
    RolloutBatch(1, rollouts).write(run.rollouts(1))


def train_one_step(tiny_model: Path, out: Path, name: str, dp: int, **trainer: Any) -> dict[str, torch.Tensor]:
    cfg = rl_config(tiny_model, out, name, max_steps=1)
    cfg["trainer"] = {"optim": {"lr": 1e-2}, "micro_batch_size": 2, "num_threads": 1, **trainer}
    cfg["trainer"]["parallel"] = {"dp": dp, **cfg["trainer"].get("parallel", {})}
    run = RunFolder(out / name)
    run.prepare("rl", cfg, resume=False, overwrite=False)  # the trainer alone writes only into a prepared folder
    write_batch(run)
    config = write_config(cfg, out / f"{name}.json")
    result = subprocess.run(
        [*(torchrun(dp) if dp > 1 else [sys.executable]), "-m", "lorarl.cli.trainer", "@", str(config)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(run.broadcast(1) / "adapter_model.safetensors")


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    # Adam's first step is about lr * sign(gradient): the rare gradient entry within float noise of
    # 0 (summed in another order over two ranks) may step either way (by about lr: 1e-2 in these
    # tests). Gradients summed in another order also differ in their last bits, which Adam's
    # normalisation carries into its steps: in a whole model fine-tuned for 3 steps 0.22% of the
    # entries differ beyond float tolerance, by at most 1e-4. Ranks that did not sum their gradients
    # would disagree almost everywhere, by about lr.
    assert a.keys() == b.keys()
    total = sum(t.numel() for t in a.values())
    noisy = sum(int((~torch.isclose(a[k], b[k], rtol=1e-5, atol=1e-6)).sum()) for k in a)
    flipped = sum(int(((a[k] - b[k]).abs() > 1e-3).sum()) for k in a)
    assert noisy <= 0.01 * total and flipped <= 0.001 * total, (noisy, flipped)


def test_two_ranks_train_the_same_adapter_as_one(tiny_model: Path, tmp_path: Path) -> None:
    single = train_one_step(tiny_model, tmp_path, "dp1", dp=1)
    double = train_one_step(tiny_model, tmp_path, "dp2", dp=2)
    start = load_file(RunFolder(tmp_path / "dp1").broadcast(0) / "adapter_model.safetensors")
    assert any(not torch.equal(single[k], start[k]) for k in single)  # the step changed the adapter
    assert_same_weights(double, single)


def step_metrics(run: Path) -> dict[str, float]:
    return {k: v for k, v in json.loads((run / "metrics.jsonl").read_text()).items() if isinstance(v, float)}


def test_fsdp_ranks_train_the_same_adapter_as_one_process(tiny_model: Path, tmp_path: Path) -> None:
    # One sample per pass: the ranks' shares of 4 and 3 samples take 4 and 3 passes, so the second rank
    # runs a pass without loss tokens. The KL term runs a pass with the adapter disabled. The sharded
    # ranks apply the output head in chunks of 5 targets, recomputed in the backward pass.
    trainer = {"micro_batch_size": 1, "packing": False, "loss": {"kl_coef": 0.1}}
    single = train_one_step(tiny_model, tmp_path, "single", 1, **trainer, logits_chunk_size=0)
    sharded = train_one_step(tiny_model, tmp_path, "fsdp", 2, **trainer, gradient_checkpointing=True,
                             parallel={"fsdp": True}, logits_chunk_size=5)  # fmt: skip
    assert_same_weights(sharded, single)
    assert (tmp_path / "fsdp" / "broadcasts" / "step_1" / "STABLE").is_file()
    config = {name: json.loads((tmp_path / name / "broadcasts" / "step_1" / "adapter_config.json").read_text())
              for name in ("single", "fsdp")}  # fmt: skip
    for c in config.values():
        c["target_modules"] = sorted(c["target_modules"])  # PEFT writes a set
    assert config["fsdp"] == config["single"]
    # Adam steps the same for any scale of the gradient: the norm tells a sum over ranks from a mean.
    got, want = (step_metrics(tmp_path / name) for name in ("fsdp", "single"))
    for key in ("loss", "grad_norm", "kl_to_base", "entropy"):
        assert abs(got[key] - want[key]) <= 1e-4 * abs(want[key]) + 1e-7, (key, got[key], want[key])


def sft_final(
    tiny_model: Path, out: Path, data: Path, name: str, dp: int, lora: bool = True, **overrides: Any
) -> dict[str, torch.Tensor]:
    cfg = {
        "max_steps": 3, "seq_len": 64, "output_dir": str(out), "run_name": name, "batch_size": 6,
        "micro_batch_size": 2, "model": {"name": str(tiny_model)},
        "data": {"path": str(data), "eval_fraction": 0.25}, "eval": {"interval": 3}, "optim": {"lr": 1e-2},
        "monitor": {"console": False}, **overrides,
    }  # fmt: skip
    if lora:
        cfg["model"]["lora"] = {"rank": 8, "alpha": 16}
    cfg["parallel"] = {"dp": dp, **overrides.get("parallel", {})}
    config = write_config(cfg, out / f"{name}.json")
    # `sft` starts itself under torchrun when parallel.dp > 1.
    result = subprocess.run([console_script("sft"), "@", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(next((out / name / "final").glob("*.safetensors")))


def write_chat_data(path: Path) -> Path:
    words = ["apple", "stone", "river", "cloud", "green", "paper", "table", "water", "bread", "chair", "dream"]
    path.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": w}, {"role": "assistant", "content": w[::-1]}]}) + "\n"
        for w in words
    ))  # fmt: skip
    return path


def test_sft_with_two_ranks_trains_the_same_adapter_as_one(tiny_model: Path, tmp_path: Path) -> None:
    data = write_chat_data(tmp_path / "chat.jsonl")
    single, double = (sft_final(tiny_model, tmp_path, data, f"sft-dp{dp}", dp) for dp in (1, 2))
    assert_same_weights(double, single)
    rows = {dp: (tmp_path / f"sft-dp{dp}" / "metrics.jsonl").read_text().splitlines() for dp in (1, 2)}
    assert len(rows[2]) == len(rows[1])  # rank 0 alone logs
    last = {dp: json.loads(rows[dp][-1]) for dp in (1, 2)}
    assert abs(last[2]["eval/loss"] - last[1]["eval/loss"]) < 1e-3


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_sft_with_fsdp_trains_as_one_process_and_resumes_either_way(
    tiny_model: Path, tmp_path: Path, lora: bool
) -> None:
    data = write_chat_data(tmp_path / "chat.jsonl")
    # Shares of 3 and 2 samples a step, and of 2 and 1 eval samples: the second rank runs filler passes.
    settings: dict[str, Any] = {"batch_size": 5, "micro_batch_size": 1, "packing": False, "log_interval": 1,
                                "ckpt": {"interval": 1}}  # fmt: skip
    fsdp = {"parallel": {"fsdp": True}}
    # Both apply the output head (tied to the embeddings) in chunks of 5 targets, recomputed in the backward
    # pass: of the sharded model too. (Against the whole pass, rounding flips a few Adam steps of a whole model.)
    settings["logits_chunk_size"] = 5
    sharded = sft_final(tiny_model, tmp_path, data, "fsdp", 2, lora, **settings, **fsdp)
    single = sft_final(tiny_model, tmp_path, data, "single", 1, lora, **settings)
    assert_same_weights(sharded, single)
    rows = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("fsdp", "single")}  # fmt: skip
    for got, want in zip(rows["fsdp"], rows["single"], strict=True):
        for key in ("loss", "grad_norm", "eval/loss"):  # grad_norm: a mean over ranks would halve it
            assert abs(got.get(key, 0) - want.get(key, 0)) <= 1e-4 * abs(want.get(key, 0)), (key, got, want)

    # A checkpoint continues under the other layout: the same weights as the run that wrote it. One way
    # per parametrization (each resume is another process start): the sharded full model's checkpoint
    # resumes in one process, one process's adapter checkpoint resumes sharded.
    written, dp, extra = ("single", 2, fsdp) if lora else ("fsdp", 1, {})
    resumed = f"{written}-then-{'fsdp' if dp == 2 else 'single'}"
    shutil.copytree(tmp_path / written, tmp_path / resumed)
    shutil.rmtree(tmp_path / resumed / "final")
    again = sft_final(tiny_model, tmp_path, data, resumed, dp, lora, **settings, **extra, resume={"step": 2})
    assert_same_weights(again, sharded if written == "fsdp" else single)
    # It went on from step 2 (from scratch it would have logged steps 1 and 2 again).
    logged = [json.loads(line)["step"] for line in (tmp_path / resumed / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3], logged


def test_rl_runs_sharded_data_parallel_trainer_ranks(tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    """Through `rl`: two fsdp trainer ranks under torchrun, rollouts from a real vLLM server."""
    cfg = rl_config(tiny_model, tmp_path, "rl-fsdp", max_steps=2, **{"inference.urls": [vllm_server]})
    cfg["trainer"] |= {"num_threads": 1, "parallel": {"dp": 2, "fsdp": True}}
    result = run_rl(write_config(cfg, tmp_path / "rl.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "rl-fsdp"
    assert "--nproc-per-node=2" in (run / "configs" / "commands.txt").read_text()
    assert sorted(r["step"] for r in metrics(run) if r["component"] == "trainer") == [1, 2]
    # The orchestrator served every version the sharded trainer broadcast.
    assert "policy version 2 loaded" in (run / "logs" / "orchestrator.log").read_text()
