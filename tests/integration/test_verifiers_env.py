"""A verifiers taskset trains through `rl` against real vLLM: the shipped verifiers config runs two
steps, and each of the task's rewards and metrics is logged under env/<taskset>/<name>, the reward
being their weighted sum."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import API_KEY, REPO
from tests.integration.helpers import metrics, rl_command

pytestmark = pytest.mark.integration


def test_a_verifiers_taskset_runs_two_steps_with_its_rewards_logged(
    tiny_model: Path, vllm_server: str, tmp_path: Path
) -> None:
    flags = ["--model.name", str(tiny_model), "--inference.urls", f'["{vllm_server}"]', "--inference.api_key", API_KEY,
             "--max_steps", "2", "--output_dir", str(tmp_path), "--run_name", "verifiers",
             "--orchestrator.batch_size", "8"]  # fmt: skip
    config = REPO / "configs" / "verifiers" / "rl.toml"
    result = subprocess.run(rl_command(config, *flags), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = metrics(tmp_path / "verifiers")
    assert sorted(r["step"] for r in rows if r["component"] == "trainer") == [1, 2]
    batches = [r for r in rows if r["component"] == "orchestrator" and "env/reverse_words/exact" in r]
    assert len(batches) == 2
    for r in batches:
        assert r["reward_errors"] == 0
        assert 0.0 <= r["env/reverse_words/exact"] <= r["env/reverse_words/similarity"] <= 1.0
        assert r["env/reverse_words/reply_chars"] >= 0.0  # a metric: logged, not rewarded
        weighted = r["env/reverse_words/exact"] + 0.5 * r["env/reverse_words/similarity"]
        assert r["env/reverse_words/reward"] == pytest.approx(weighted)
