"""Data parallel: two CPU ranks (torchrun, gloo) give the same adapter as one process."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lorarl.launcher.plan import torchrun
from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder
from tests.integration.helpers import rl_config, write_config

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


def train_one_step(tiny_model: Path, out: Path, dp: int) -> dict[str, torch.Tensor]:
    cfg = rl_config(tiny_model, out, f"dp{dp}", max_steps=1)
    cfg["trainer"] = {"optim": {"lr": 1e-2}, "micro_batch_size": 2, "parallel": {"dp": dp}, "num_threads": 1}
    run = RunFolder(out / f"dp{dp}")
    write_batch(run)
    config = write_config(cfg, out / f"dp{dp}.json")
    result = subprocess.run(
        [*(torchrun(dp) if dp > 1 else [sys.executable]), "-m", "lorarl.cli.trainer", "@", str(config)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(run.broadcast(1) / "adapter_model.safetensors")


def test_two_ranks_train_the_same_adapter_as_one(tiny_model: Path, tmp_path: Path) -> None:
    single = train_one_step(tiny_model, tmp_path, dp=1)
    double = train_one_step(tiny_model, tmp_path, dp=2)
    start = load_file(RunFolder(tmp_path / "dp1").broadcast(0) / "adapter_model.safetensors")
    assert single.keys() == double.keys()
    assert any(not torch.equal(single[k], start[k]) for k in single)  # the step changed the adapter
    # Adam's first step is about lr * sign(gradient): the rare gradient entry within float noise of
    # 0 (summed in another order over two ranks) may step either way. Every other entry must agree;
    # ranks that did not sum their gradients would disagree almost everywhere.
    differ = sum(int((~torch.isclose(double[k], single[k], rtol=1e-5, atol=1e-6)).sum()) for k in single)
    assert differ <= 0.001 * sum(t.numel() for t in single.values()), differ


def sft_final(tiny_model: Path, out: Path, data: Path, dp: int) -> dict[str, torch.Tensor]:
    cfg = {
        "max_steps": 3, "seq_len": 64, "output_dir": str(out), "run_name": f"sft-dp{dp}", "batch_size": 6,
        "micro_batch_size": 2, "model": {"name": str(tiny_model), "lora": {"rank": 8, "alpha": 16}},
        "data": {"path": str(data), "eval_fraction": 0.25}, "eval": {"interval": 3}, "optim": {"lr": 1e-2},
        "parallel": {"dp": dp}, "monitor": {"console": False},
    }  # fmt: skip
    config = write_config(cfg, out / f"sft-dp{dp}.json")
    # `sft` starts itself under torchrun when parallel.dp > 1.
    result = subprocess.run([sys.executable, "-m", "lorarl.cli.sft", "@", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(out / f"sft-dp{dp}" / "final" / "adapter_model.safetensors")


def test_sft_with_two_ranks_trains_the_same_adapter_as_one(tiny_model: Path, tmp_path: Path) -> None:
    import json

    words = ["apple", "stone", "river", "cloud", "green", "paper", "table", "water", "bread", "chair", "dream"]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": w}, {"role": "assistant", "content": w[::-1]}]}) + "\n"
        for w in words
    ))  # fmt: skip
    single, double = (sft_final(tiny_model, tmp_path, data, dp) for dp in (1, 2))
    differ = sum(int((~torch.isclose(double[k], single[k], rtol=1e-5, atol=1e-6)).sum()) for k in single)
    assert differ <= 0.001 * sum(t.numel() for t in single.values()), differ
    rows = {dp: (tmp_path / f"sft-dp{dp}" / "metrics.jsonl").read_text().splitlines() for dp in (1, 2)}
    assert len(rows[2]) == len(rows[1])  # rank 0 alone logs
    last = {dp: json.loads(rows[dp][-1]) for dp in (1, 2)}
    assert abs(last[2]["eval/loss"] - last[1]["eval/loss"]) < 1e-3
