"""`sft` writes an adapter that `rl` starts from (model.lora.init_adapter)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.helpers import console_script, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration


def write_chat_data(path: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": w}, {"role": "assistant", "content": w[::-1]}]}
        for w in ("apple", "stone", "river", "cloud", "green", "paper")
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_sft(tiny_model: Path, tmp_path: Path, data: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cfg = {
        "max_steps": 20, "seq_len": 64, "output_dir": str(tmp_path), "run_name": "sft", "batch_size": 6,
        "micro_batch_size": 3, "log_interval": 5, "model": {"name": str(tiny_model), "lora": {"rank": 8, "alpha": 16}},
        "data": {"path": str(data)}, "optim": {"lr": 1e-2}, "monitor": {"console": False},
    }  # fmt: skip
    config = write_config(cfg, tmp_path / "sft.json")
    cmd = [console_script("sft"), "@", str(config), *flags]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_sft_adapter_starts_an_rl_run(tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    result = run_sft(tiny_model, tmp_path, write_chat_data(tmp_path / "chat.jsonl"))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3  # it is learning the six reversals
    adapter = tmp_path / "sft" / "final"
    assert (adapter / "adapter_config.json").exists()

    cfg = rl_config(tiny_model, tmp_path, "from-sft", max_steps=1, **{"inference.urls": [vllm_server]})
    cfg["model"]["lora"]["init_adapter"] = str(adapter)
    cfg["orchestrator"]["delete_old_broadcasts"] = False  # step_0 is compared below
    rl = run_rl(write_config(cfg, tmp_path / "rl.json"))
    assert rl.returncode == 0, rl.stderr[-3000:]
    # The policy the run starts from (broadcasts/step_0) is the SFT adapter, weight for weight.
    start = load_file(tmp_path / "from-sft" / "broadcasts" / "step_0" / "adapter_model.safetensors")
    sft = load_file(adapter / "adapter_model.safetensors")
    assert start.keys() == sft.keys() and len(sft) > 0
    for key in sft:
        torch.testing.assert_close(start[key], sft[key])


def test_malformed_record_names_file_and_line(tiny_model: Path, tmp_path: Path) -> None:
    data = write_chat_data(tmp_path / "chat.jsonl")
    data.write_text(data.read_text() + '{"messages": "not a list"}\n')
    result = run_sft(tiny_model, tmp_path, data)
    assert result.returncode != 0
    assert f"{data}:7: malformed record" in result.stderr


def test_eval_checkpoints_and_resume_from_the_command_line(tiny_model: Path, tmp_path: Path) -> None:
    data = write_chat_data(tmp_path / "chat.jsonl")
    flags = ["--data.eval_fraction", "0.34", "--eval.interval", "10", "--ckpt.interval", "10", "--ckpt.keep_last", "1"]
    first = run_sft(tiny_model, tmp_path, data, *flags)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "4 training samples, 2 eval samples" in first.stderr
    checkpoints = tmp_path / "sft" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_20"]  # keep_last 1

    again = run_sft(tiny_model, tmp_path, data, *flags, "--resume", "--max_steps", "30")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {checkpoints / 'step_20' / 'trainer'}" in again.stderr
    assert again.stderr.count("resuming from checkpoint step 20") == 1  # said once, not by the check before too
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30]
    assert [r["step"] for r in rows if "eval/loss" in r] == [10, 20, 30]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_30"]
