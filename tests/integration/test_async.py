"""Asynchrony bounds, and runs sharing one inference fleet, against a real vLLM server."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.helpers import ModelListWatcher, metrics, models_request, rl_command, rl_config, write_config

pytestmark = pytest.mark.integration


def batch_versions(run: Path, step: int) -> list[int]:
    lines = (run / "rollouts" / f"step_{step}" / "rollouts.jsonl").read_text().splitlines()
    return [json.loads(line)["policy_version"] for line in lines]


@pytest.mark.parametrize("level", [0, 1, 2])
def test_batches_never_lag_more_than_max_async_level(
    level: int, tiny_model: Path, vllm_server: str, tmp_path: Path
) -> None:
    steps = 5
    cfg = rl_config(tiny_model, tmp_path, f"async{level}", max_steps=steps, **{"inference.urls": [vllm_server]})
    cfg["orchestrator"]["max_async_level"] = level
    result = subprocess.run(rl_command(write_config(cfg, tmp_path / "rl.json")), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lags = []
    for step in range(1, steps + 1):
        versions = batch_versions(tmp_path / f"async{level}", step)
        lags += [step - 1 - v for v in versions]
    assert min(lags) >= 0 and max(lags) <= level, lags
    # Sampling really runs ahead: the first batches are sampled before the trainer has stepped.
    assert max(lags) == level
    # The trainer logs the lag of what it trained on; a step whose groups all had zero advantage
    # trains on an empty batch (skip_zero_advantage) and logs none.
    trainer = [r for r in metrics(tmp_path / f"async{level}") if r["component"] == "trainer"]
    assert all(("policy_lag/max" in r) == (r["samples"] > 0) for r in trainer)
    assert max(r["policy_lag/max"] for r in trainer if r["samples"] > 0) == level
    # Old adapter folders are deleted once unloaded; the final version stays.
    assert sorted(p.name for p in (tmp_path / f"async{level}" / "broadcasts").iterdir()) == [f"step_{steps}"]


def test_two_runs_share_one_inference_server(tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    procs = {}
    with ModelListWatcher(vllm_server) as watcher:
        for name in ("alice", "bob"):
            cfg = rl_config(tiny_model, tmp_path, name, max_steps=3, **{"inference.urls": [vllm_server]})
            cfg["monitor"]["console"] = name == "alice"  # bob's run prints no step lines
            procs[name] = subprocess.Popen(rl_command(write_config(cfg, tmp_path / f"{name}.json")),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, (name, err[-3000:])
            assert ("step    3/3 | reward" in out) == (name == "alice"), out
    for name in ("alice", "bob"):
        assert {f"{name}-step{s}" for s in range(4)} <= watcher.seen
    # The server takes no request without its key (inference.api_key), which the runs sent.
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(f"{vllm_server}/v1/models")
    # Each run's final adapter stays served from its own folder.
    with urllib.request.urlopen(models_request(vllm_server)) as r:
        roots = {m["id"]: m["root"] for m in json.load(r)["data"]}
    for name in ("alice", "bob"):
        assert Path(roots[f"{name}-step3"]) == (tmp_path / name / "broadcasts" / "step_3").resolve()


def test_continuous_batching_drops_a_straggler_once_too_old(tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    """With max_off_policy_steps, batches take the groups that finish first: the straggler (the
    first example, whose scoring never ends) holds no batch up, and is dropped, once, when it
    would lag more than the bound. Without it the run would wait for the straggler forever."""
    steps = 4
    cfg = rl_config(tiny_model, tmp_path, "straggler", max_steps=steps, **{"inference.urls": [vllm_server]})
    cfg["orchestrator"] |= {"max_async_level": 1, "max_off_policy_steps": 1}
    cfg["orchestrator"]["env"] = [{"id": "tests.integration.straggler_env:StragglerReverseText"}]
    result = subprocess.run(
        rl_command(write_config(cfg, tmp_path / "rl.json")), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "straggler"
    orchestrator = {r["step"]: r for r in metrics(run) if r["component"] == "orchestrator"}
    for step in range(1, steps + 1):
        rows = [json.loads(line) for line in (run / "rollouts" / f"step_{step}" / "rollouts.jsonl").open()]
        # A full batch, less the groups whose rewards were all equal (skip_zero_advantage).
        assert len(rows) == cfg["orchestrator"]["batch_size"] - orchestrator[step]["rollouts/skipped"]
        assert all(0 <= step - 1 - r["policy_version"] <= 1 for r in rows)
        assert not any(r["metrics"]["is_straggler"] for r in rows)
    # Drawn for step 1 with version 0, it may still land in batch 2 (lag 1); at batch 3 it would lag 2.
    assert [orchestrator[s]["dropped/groups"] for s in range(1, steps + 1)] == [0, 0, 1, 0]
    assert orchestrator[3]["dropped/rollouts"] == cfg["orchestrator"]["rollouts_per_example"]
