"""`rl` with model.full_finetune end to end: every weight trains, each version is a whole model that
the vLLM worker (started by `rl`, with lorarl's weight-reload extension) reloads in place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import free_port
from tests.integration.helpers import metrics, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def full_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("full")
    cfg = rl_config(tiny_model, out, "full", **{"inference.port": free_port()})
    cfg["model"] = {"name": str(tiny_model), "full_finetune": True}
    cfg["trainer"]["optim"]["lr"] = 3e-3  # a step that moves the logprobs well past numerical noise
    cfg["orchestrator"]["delete_old_broadcasts"] = False  # the test reads every version
    result = run_rl(write_config(cfg, out / "rl.json"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out / "full"


def completion_logprobs(model: torch.nn.Module, rollout: dict) -> torch.Tensor:
    """The model's logprobs of the rollout's completion tokens at the sampling temperature."""
    prompt, completion = rollout["prompt_ids"], rollout["completion_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
    return logprobs.gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_every_version_is_a_whole_model_and_training_changes_every_kind_of_weight(full_run: Path) -> None:
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(full_run / "broadcasts" / "step_0").state_dict()
    for step in (1, 2, 3):
        folder = full_run / "broadcasts" / f"step_{step}"
        assert (folder / "STABLE").exists() and (folder / "model.safetensors").exists(), folder
        weights = AutoModelForCausalLM.from_pretrained(folder).state_dict()
        # Full fine-tuning: embeddings, attention, MLP and norms all move, not just adapted projections.
        for part in ("embed_tokens", "self_attn.q_proj", "mlp.down_proj", "input_layernorm"):
            name = next(n for n in base if part in n)
            assert not torch.equal(weights[name], base[name]), (step, name)


def test_vllm_samples_each_batch_from_the_version_it_reloaded(full_run: Path) -> None:
    """Step 3's batch was sampled (max_async_level 0) by version 2: vLLM's logprobs of it are version
    2's, far from those of the starting weights, so the workers really serve the reloaded model."""
    from transformers import AutoModelForCausalLM

    rollouts = [json.loads(line) for line in (full_run / "rollouts" / "step_3" / "rollouts.jsonl").open()]
    assert rollouts and all(r["policy_version"] == 2 for r in rollouts)
    served = AutoModelForCausalLM.from_pretrained(full_run / "broadcasts" / "step_2")
    start = AutoModelForCausalLM.from_pretrained(full_run / "broadcasts" / "step_0")
    vllm = torch.tensor([lp for r in rollouts for lp in r["completion_logprobs"]])
    to_served = (torch.cat([completion_logprobs(served, r) for r in rollouts]) - vllm).abs().mean().item()
    to_start = (torch.cat([completion_logprobs(start, r) for r in rollouts]) - vllm).abs().mean().item()
    assert to_served < 1e-4 and to_start > 100 * to_served, (to_served, to_start)


def test_the_trainer_scores_what_vllm_sampled_at_every_step(full_run: Path) -> None:
    trainer = [r for r in metrics(full_run) if r["component"] == "trainer"]
    assert [r["step"] for r in trainer] == [1, 2, 3]
    assert all(r["mismatch/logprob_abs_diff"] < 1e-4 for r in trainer), trainer
    assert all(r["grad_norm"] > 0 for r in trainer)
