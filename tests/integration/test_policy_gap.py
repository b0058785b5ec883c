"""The policy gap split with real vLLM (trainer.policy_gap_interval): sampled one version behind, the
gap is the policy's own move, and what vLLM serves matches the trainer at the version that sampled."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.helpers import metrics, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration


def test_the_gap_splits_into_the_policys_move_and_no_serving_mismatch(
    tiny_model: Path, vllm_server: str, tmp_path: Path
) -> None:
    cfg = rl_config(tiny_model, tmp_path, "gap", **{"inference.urls": [vllm_server]})
    cfg["orchestrator"]["max_async_level"] = 1
    cfg["orchestrator"]["sampling"]["top_p"] = 0.9  # with the nucleus, as the trainer scores it
    cfg["trainer"]["policy_gap_interval"] = 1
    result = run_rl(write_config(cfg, tmp_path / "rl.json"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trainer = [r for r in metrics(tmp_path / "gap") if r["component"] == "trainer"]
    assert len(trainer) == 3
    for r in trainer:
        # fp32 on the CPU: the served adapter of each version is the trainer's to float rounding.
        assert r["mismatch/serving"] < 1e-4 and r["mismatch/gap_left_out"] == 0, r
        assert r["time/policy_gap"] > 0
    lagged = [r for r in trainer if r["policy_lag/max"] >= 1]
    assert lagged, trainer  # max_async_level 1: some batch was sampled by the version before
    # The whole gap of a lagged batch is the policy's move (the update of lr 1e-3), not serving.
    assert all(r["mismatch/policy_moved"] > 100 * r["mismatch/serving"] for r in lagged), lagged
