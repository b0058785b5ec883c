"""`rl` end to end against a real vLLM server: adapters, hot-loading, metrics, logprob agreement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.integration.helpers import ModelListWatcher, metrics, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def finished_run(tiny_model: Path, vllm_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("runs")
    cfg = rl_config(tiny_model, out, "e2e", **{"inference.urls": [vllm_server]})
    cfg["orchestrator"]["eval"] = {"interval": 2, "num_examples": 3, "rollouts_per_example": 2}
    cfg["orchestrator"]["delete_old_broadcasts"] = False  # every version is inspected below
    config = write_config(cfg, out / "rl.json")
    with ModelListWatcher(vllm_server) as watcher:
        result = run_rl(config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"run": out / "e2e", "seen": watcher.seen, "result": result, "model": tiny_model}


def test_every_step_broadcasts_a_loadable_peft_adapter(finished_run: dict) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run: Path = finished_run["run"]
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    base = AutoModelForCausalLM.from_pretrained(finished_run["model"])
    with torch.no_grad():
        base_logits = base(ids).logits
    for step in range(0, 4):
        folder = run / "broadcasts" / f"step_{step}"
        assert (folder / "STABLE").exists(), folder
        assert (folder / "adapter_model.safetensors").exists()
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(finished_run["model"]), folder)
        with torch.no_grad():
            logits = model(ids).logits
        # Step 0 is the fresh adapter (B = 0): exactly the base model. Trained steps differ from it.
        if step == 0:
            torch.testing.assert_close(logits, base_logits)
        else:
            assert not torch.allclose(logits, base_logits, atol=1e-6), f"step {step} adapter is still the base"


def test_vllm_listed_every_adapter_version(finished_run: dict) -> None:
    seen = finished_run["seen"]
    for step in range(0, 4):
        assert f"e2e-step{step}" in seen, sorted(seen)


def test_metrics_have_trainer_and_orchestrator_rows_for_every_step(finished_run: dict) -> None:
    rows = metrics(finished_run["run"])
    for component in ("trainer", "orchestrator"):
        steps = sorted(r["step"] for r in rows if r["component"] == component)
        assert steps == [1, 2, 3], (component, steps)
    trainer = [r for r in rows if r["component"] == "trainer"]
    orch = [r for r in rows if r["component"] == "orchestrator"]
    for r in trainer:
        for key in ("loss", "grad_norm", "mismatch/logprob_abs_diff", "policy_lag/mean", "time/step"):
            assert isinstance(r[key], float | int), (key, r)
    for r in orch:
        for key in ("reward/mean", "reward/std", "completion_len/mean", "policy_lag/max", "inference/busy_frac"):
            assert isinstance(r[key], float | int), (key, r)
        assert r["policy_lag/max"] == 0  # max_async_level = 0: always the newest policy
    # The console shows one summary line per step.
    assert finished_run["result"].stdout.count("step ") >= 3


def test_trainer_and_vllm_logprobs_agree(finished_run: dict) -> None:
    """Sampled at temperature 0.7 with max_async_level 0, so the trainer scores each batch with
    exactly the weights vLLM sampled it with: any difference is numerical, or a convention bug
    (vLLM's logprobs without temperature would differ by far more than this bound)."""
    trainer = [r for r in metrics(finished_run["run"]) if r["component"] == "trainer"]
    diffs = [r["mismatch/logprob_abs_diff"] for r in trainer]
    assert all(d < 1e-4 for d in diffs), diffs


def test_rollout_batches_hold_what_the_trainer_needs(finished_run: dict) -> None:
    lines = (finished_run["run"] / "rollouts" / "step_1" / "rollouts.jsonl").read_text().splitlines()
    # 4 groups of 4, less those whose rewards were all equal (skip_zero_advantage, on by default).
    step_1 = next(r for r in metrics(finished_run["run"]) if r["component"] == "orchestrator" and r["step"] == 1)
    assert len(lines) == step_1["rollouts/trained"] == 16 - 4 * step_1["groups/zero_advantage"] > 0
    r = json.loads(lines[0])
    assert len(r["completion_ids"]) == len(r["completion_logprobs"]) > 0
    assert r["policy_version"] == 0 and r["temperature"] == 0.7
    # Advantages are group-normalized: they sum to ~0 in each group of 4.
    advantages = [json.loads(line)["advantage"] for line in lines]
    for g in range(len(lines) // 4):
        assert abs(sum(advantages[4 * g : 4 * g + 4])) < 1e-4


def test_evals_report_avg_and_pass_at_k_for_the_start_every_interval_and_the_end(finished_run: dict) -> None:
    evals = {r["step"]: r for r in metrics(finished_run["run"]) if r["component"] == "eval"}
    assert sorted(evals) == [0, 2, 3]
    for row in evals.values():
        avg, best = row["eval/reverse_text/avg@2"], row["eval/reverse_text/pass@2"]
        assert 0.0 <= avg <= best <= 1.0


def test_samples_show_decoded_episodes(finished_run: dict) -> None:
    lines = (finished_run["run"] / "samples" / "step_2.jsonl").read_text().splitlines()
    sample = json.loads(lines[0])
    assert sample["env"] == "reverse_text"
    assert sample["messages"][-1]["role"] == "assistant"
    assert 0.0 <= sample["reward"] <= 1.0
