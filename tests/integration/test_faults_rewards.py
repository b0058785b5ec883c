"""A reward function that never returns, through the installed `rl`: each call costs its
orchestrator.reward_timeout, scores 0 and is counted in reward_errors; the run finishes its steps and
exits, its orchestrator not held by the calls it abandoned."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.helpers import metrics, rl_config, run_rl, steps_logged, write_config

pytestmark = pytest.mark.integration


def test_a_reward_that_never_returns_costs_its_timeout_not_the_run(
    tiny_model: Path, vllm_server: str, tmp_path: Path
) -> None:
    cfg = rl_config(tiny_model, tmp_path, "hang", max_steps=2, **{"inference.urls": [vllm_server]})
    cfg["orchestrator"] |= {
        "batch_size": 8,
        "reward_timeout": 2,
        "env": [{"id": "tests.integration.hanging_reward_env:HangingRewardReverseText"}],
    }
    start = time.monotonic()
    done = run_rl(write_config(cfg, tmp_path / "rl.json"), timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - start < 300
    run = tmp_path / "hang"
    assert steps_logged(run, "trainer") == [1, 2]
    rows = [r for r in metrics(run) if r["component"] == "orchestrator"]
    # Every episode's hung call timed out: counted per episode (the mean over the batch), scored 0.
    assert [r["reward_errors"] for r in rows] == [8, 8]
    assert all(r["env/hanging_reward_reverse_text/reward_errors"] == 1 for r in rows)
    assert all(r["env/hanging_reward_reverse_text/never_returns"] == 0 for r in rows)
    log = (run / "logs" / "orchestrator.log").read_text()
    assert "reward function never_returns of hanging_reward_reverse_text: no score within 2 s" in log
