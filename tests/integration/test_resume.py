"""`rl --resume`: a run stopped after a checkpoint continues with the same examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import metrics, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration


def examples(run: Path, step: int) -> list[str]:
    """The example of every episode played for `step`: samples/ logs them all (num_samples_to_log 16),
    also those of groups left out of the batch as zero-advantage."""
    lines = (run / "samples" / f"step_{step}.jsonl").read_text().splitlines()
    return sorted(json.loads(line)["messages"][1]["content"] for line in lines)


def test_resume_continues_after_the_checkpoint(tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    def config(name: str, max_steps: int) -> Path:
        cfg = rl_config(tiny_model, tmp_path, name, max_steps=max_steps, **{"inference.urls": [vllm_server]})
        cfg["trainer"]["ckpt"] = {"interval": 2}
        cfg["orchestrator"]["num_samples_to_log"] = cfg["orchestrator"]["batch_size"]
        return write_config(cfg, tmp_path / f"{name}-{max_steps}.json")

    straight = run_rl(config("straight", 4))
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = run_rl(config("stopped", 2))
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "stopped" / "checkpoints" / "step_2" / "orchestrator" / "state.json").is_file()
    # Another adapter shape is another run: refused in one line by the dry run, before anything starts.
    rank = json.loads(config("stopped", 4).read_text())["model"]["lora"]["rank"]
    reshaped = run_rl(config("stopped", 4), "--resume", "--dry-run", "--model.lora.rank", str(2 * rank))
    assert reshaped.returncode == 2 and f"model.lora.rank: {rank} -> {2 * rank}" in reshaped.stderr, reshaped.stderr
    assert "Traceback" not in reshaped.stderr
    resumed = run_rl(config("stopped", 4), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "changed since the run started: max_steps: 2 -> 4" in resumed.stderr, resumed.stderr[-3000:]

    run = tmp_path / "stopped"
    for component in ("trainer", "orchestrator"):
        assert sorted(r["step"] for r in metrics(run) if r["component"] == component) == [1, 2, 3, 4]
    # The resumed orchestrator draws the examples the uninterrupted run drew for steps 3 and 4.
    for step in (3, 4):
        assert examples(run, step) == examples(tmp_path / "straight", step)
        assert len(examples(run, step)) == 16
    # It started from the checkpointed policy: the first version it sampled with is 2.
    versions = {json.loads(line)["policy_version"] for line in (run / "rollouts" / "step_3" / "rollouts.jsonl").open()}
    assert versions == {2}
