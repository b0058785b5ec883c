"""Every shipped environment config runs through `rl` against real vLLM (two steps each); for the
configs of other libraries' environments, their rewards and metrics are logged as they define them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import API_KEY, REPO, free_port
from tests.integration.helpers import metrics, rl_command

pytestmark = pytest.mark.integration

# rl.toml of each folder; configs/verifiers/ has one for each kind of verifiers taskset. configs/serve/
# is lorarl-serve's (tests/integration/serve start it).
CONFIGS = sorted(
    p for p in REPO.glob("configs/*/*.toml") if not p.stem.startswith("sft") and p.parent.name != "serve"
) + sorted(REPO.glob("examples/*/rl.toml"))


def check_verifiers_rewards(rows: list[dict[str, Any]]) -> None:
    """examples/verifiers_env/reverse_words.py: each reward and metric of the task is logged under
    env/<taskset>/<name>, the reward being their weighted sum (exact + 0.5 * similarity)."""
    for r in orchestrator_rows(rows, "env/reverse_words/exact"):
        assert 0.0 <= r["env/reverse_words/exact"] <= r["env/reverse_words/similarity"] <= 1.0
        assert r["env/reverse_words/reply_chars"] >= 0.0  # a metric: logged, not rewarded
        weighted = r["env/reverse_words/exact"] + 0.5 * r["env/reverse_words/similarity"]
        assert r["env/reverse_words/reward"] == pytest.approx(weighted)


def orchestrator_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    batches = [r for r in rows if r["component"] == "orchestrator" and key in r]
    assert len(batches) == 2
    return batches


def check_verifiers_tool_rewards(rows: list[dict[str, Any]]) -> None:
    """examples/verifiers_env/price_lookup.py: the task's reward and metrics (one reading the state its
    in-process tool wrote) are logged beside lorarl's tool call counts."""
    for r in orchestrator_rows(rows, "env/price_lookup/correct"):
        assert r["env/price_lookup/reward"] == r["env/price_lookup/correct"]  # its one reward, weight 1
        assert 0.0 <= r["env/price_lookup/looked_up_all"] <= 1.0
        # One result per call, but for the calls of a last turn whose results no longer fit in seq_len.
        assert r["env/price_lookup/lookups"] <= r["env/price_lookup/tool_calls"]
        assert r["env/price_lookup/tool_malformed"] <= r["env/price_lookup/tool_calls"]


def check_verifiers_multi_turn_rewards(rows: list[dict[str, Any]]) -> None:
    """examples/verifiers_env/guess_number.py: its env answered turn by turn (hints, at most one a guess),
    and the reward is the task's weighted rewards (solved + 0.5 * closeness)."""
    for r in orchestrator_rows(rows, "env/guess_number/solved"):
        assert 1.0 <= r["env/guess_number/guesses"] <= 4.0  # the env's seat: 4 turns at most
        assert r["env/guess_number/hints"] <= r["env/guess_number/guesses"]
        weighted = r["env/guess_number/solved"] + 0.5 * r["env/guess_number/closeness"]
        assert r["env/guess_number/reward"] == pytest.approx(weighted)


# Config -> what else its run must have logged.
LOGGED = {
    "configs/verifiers/rl.toml": check_verifiers_rewards,
    "configs/verifiers/tools.toml": check_verifiers_tool_rewards,
    "configs/verifiers/multi_turn.toml": check_verifiers_multi_turn_rewards,
}


def test_configs_of_every_builtin_environment_are_shipped() -> None:
    from lorarl.orchestrator.envs import BUILTIN

    shipped = " ".join(p.read_text() for p in CONFIGS)
    for env_id in BUILTIN:
        assert f'id = "{env_id}"' in shipped, env_id


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_config_runs(config: Path, tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    import subprocess

    # A sweep's adapters (ranks up to 64, several versions of each) need a vLLM sized for them: rl starts
    # its own; the others share the session's server.
    sweep = "variants" in tomllib.loads(config.read_text())
    server = ["--inference.port", str(free_port())] if sweep else ["--inference.urls", f'["{vllm_server}"]']
    # Two small steps; evals are the recipes' to show (scripts/learning_check.py), tested in test_rl_end_to_end.
    flags = ["--model.name", str(tiny_model), *server, "--inference.api_key", API_KEY,
             "--max_steps", "2", "--output_dir", str(tmp_path), "--run_name", "shipped",
             "--orchestrator.batch_size", "8",
             "--orchestrator.eval", "null"]  # fmt: skip
    result = subprocess.run(rl_command(config, *flags), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = metrics(tmp_path / "shipped")
    trainer = [r for r in rows if r["component"] == "trainer"]
    for variant in {r.get("variant") for r in trainer}:  # None: a run of one adapter
        assert sorted(r["step"] for r in trainer if r.get("variant") == variant) == [1, 2], variant
    assert len(trainer) == 2 * (len(tomllib.loads(config.read_text()).get("variants", [])) or 1)
    assert all(r["reward_errors"] == 0 for r in rows if r["component"] == "orchestrator")
    if check := LOGGED.get(str(config.relative_to(REPO))):
        check(rows)
