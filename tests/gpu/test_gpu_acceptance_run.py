"""The `gpu` lane: scripts/gpu_acceptance.sh and scripts/gpu_moe_acceptance.sh run as a user runs them
on a GPU machine (one model each, two steps), and must exit 0: every trainer step logged, the report
written. On a machine without a GPU the lane is deselected, not skipped (tests/conftest.py says so in
one line); `bash scripts/test.sh -m gpu tests/gpu` runs it on one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("script", "models"), [("gpu_acceptance.sh", "0.6B"), ("gpu_moe_acceptance.sh", "moe")])
def test_acceptance_script_runs_its_steps(script: str, models: str, tmp_path: Path) -> None:
    # gpu_moe_acceptance.sh sets MODELS=moe itself, over what is given here.
    env = {**os.environ, "MODELS": models, "STEPS": "2", "MAX_TOKENS": "256", "OUT_DIR": str(tmp_path),
           "PORT": str(free_port())}  # fmt: skip
    done = subprocess.run(["bash", str(REPO / "scripts" / script)], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rl exited with 0" in done.stdout
    assert (tmp_path / f"qwen3-{models}" / "metrics.jsonl").is_file()
