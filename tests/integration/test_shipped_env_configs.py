"""Every shipped environment config runs through `rl` against real vLLM (two steps each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import API_KEY, REPO
from tests.integration.helpers import metrics, rl_command

pytestmark = pytest.mark.integration

CONFIGS = sorted(REPO.glob("configs/*/rl.toml")) + sorted(REPO.glob("examples/*/rl.toml"))


def test_configs_of_every_builtin_environment_are_shipped() -> None:
    from lorarl.orchestrator.envs import BUILTIN

    shipped = " ".join(p.read_text() for p in CONFIGS)
    for env_id in BUILTIN:
        assert f'id = "{env_id}"' in shipped, env_id


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_config_runs(config: Path, tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    import subprocess

    flags = ["--model.name", str(tiny_model), "--inference.urls", f'["{vllm_server}"]', "--inference.api_key", API_KEY,
             "--max_steps", "2", "--output_dir", str(tmp_path), "--run_name", "shipped",
             "--orchestrator.batch_size", "8"]  # fmt: skip
    result = subprocess.run(rl_command(config, *flags), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = metrics(tmp_path / "shipped")
    assert sorted(r["step"] for r in rows if r["component"] == "trainer") == [1, 2]
    assert all(r["reward_errors"] == 0 for r in rows if r["component"] == "orchestrator")
