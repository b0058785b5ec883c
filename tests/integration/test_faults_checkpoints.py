"""A checkpoint damaged on disk: `rl --resume` falls back to the newest whole one and says so.

A byte flipped in the newest checkpoint's adapter keeps the file's size, so only its SHA-256 (in the
checkpoint's manifest) tells it is damaged. Through the installed `rl`, on the shared test server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.helpers import metrics, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration


def test_a_checkpoint_damaged_at_the_same_size_is_skipped_and_the_console_says_so(
    tiny_model: Path, vllm_server: str, tmp_path: Path
) -> None:
    def config(max_steps: int) -> Path:
        cfg = rl_config(tiny_model, tmp_path, "run", max_steps=max_steps, **{"inference.urls": [vllm_server]})
        cfg["trainer"]["ckpt"] = {"interval": 1}
        cfg["orchestrator"]["batch_size"] = 8
        return write_config(cfg, tmp_path / f"run-{max_steps}.json")

    first = run_rl(config(2))
    assert first.returncode == 0, first.stderr[-3000:]
    adapter = tmp_path / "run" / "checkpoints" / "step_2" / "trainer" / "adapter" / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-100] ^= 0xFF  # in the weights, past the header: the file still parses, at the same size
    adapter.write_bytes(bytes(data))

    resumed = run_rl(config(3), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    console = resumed.stdout + resumed.stderr
    assert f"skipping checkpoint step 2: {adapter} does not match its SHA-256" in console, console[-3000:]
    assert "resuming from checkpoint step 1" in console, console[-3000:]
    trainer = [r["step"] for r in metrics(tmp_path / "run") if r["component"] == "trainer"]
    assert trainer == [1, 2, 3]  # step 2 trained again from checkpoint 1, its first rows discarded
    assert (adapter.parent.parent / "MANIFEST.json").is_file()  # checkpoint 2 written again, whole
