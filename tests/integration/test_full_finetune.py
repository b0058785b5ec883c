"""`rl` with model.full_finetune end to end: every weight trains, each version is a whole model that
the vLLM worker (started by `rl`, with lorarl's weight-reload extension) reloads in place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder
from tests.conftest import free_port
from tests.integration.helpers import metrics, rl_config, run_rl, steps_logged, write_config

pytestmark = pytest.mark.integration
TEMPERATURE = 0.7


def full_config(tiny_model: Path, out: Path, max_steps: int) -> Path:
    cfg = rl_config(tiny_model, out, "full", max_steps=max_steps, **{"inference.port": free_port()})
    cfg["model"] = {"name": str(tiny_model), "full_finetune": True}
    cfg["trainer"]["optim"]["lr"] = 3e-3  # a step that moves the logprobs well past numerical noise
    cfg["trainer"]["ckpt"] = {"interval": 2}
    cfg["orchestrator"]["delete_old_broadcasts"] = False  # the test reads every version
    return write_config(cfg, out / f"rl-{max_steps}.json")


@pytest.fixture(scope="module")
def full_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("full")
    result = run_rl(full_config(tiny_model, out, max_steps=3))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out / "full"


def rollouts(run: Path, step: int) -> list[Rollout]:
    return RolloutBatch.read(RunFolder(run).rollouts(step), step).rollouts


def vllm_distance(weights: Path, batch: list[Rollout]) -> float:
    """Mean |logprob difference| between the model in `weights` and vLLM, over a batch's completions."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(weights)
    vllm = torch.tensor([lp for r in batch for lp in r.completion_logprobs])
    return (torch.cat([completion_logprobs(model, r) for r in batch]) - vllm).abs().mean().item()


def completion_logprobs(model: torch.nn.Module, rollout: Rollout) -> torch.Tensor:
    """The model's logprobs of the rollout's completion tokens at the sampling temperature."""
    prompt, completion = rollout.prompt_ids, rollout.completion_ids
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
    batch = rollouts(full_run, 3)
    assert batch and all(r.policy_version == 2 for r in batch)
    to_served = vllm_distance(full_run / "broadcasts" / "step_2", batch)
    to_start = vllm_distance(full_run / "broadcasts" / "step_0", batch)
    assert to_served < 1e-4 and to_start > 100 * to_served, (to_served, to_start)


def test_the_trainer_scores_what_vllm_sampled_at_every_step(full_run: Path) -> None:
    trainer = [r for r in metrics(full_run) if r["component"] == "trainer"]
    assert [r["step"] for r in trainer] == [1, 2, 3]
    assert all(r["mismatch/logprob_abs_diff"] < 1e-4 for r in trainer), trainer
    assert all(r["grad_norm"] > 0 for r in trainer)


def test_a_resumed_run_samples_from_the_checkpointed_weights(full_run: Path, tiny_model: Path, tmp_path: Path) -> None:
    """`rl --resume` of a full fine-tuning run (a copy of it, the other tests read the original):
    its fresh worker starts from the base model and must serve the checkpoint's weights instead."""
    shutil.copytree(full_run, tmp_path / "full")
    result = run_rl(full_config(tiny_model, tmp_path, max_steps=4), "--resume.step", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    resumed = tmp_path / "full"
    assert steps_logged(resumed, "trainer") == [1, 2, 3, 4]
    batch = rollouts(resumed, 3)
    assert batch and all(r.policy_version == 2 for r in batch)
    to_checkpoint = vllm_distance(full_run / "broadcasts" / "step_2", batch)
    to_start = vllm_distance(full_run / "broadcasts" / "step_0", batch)
    assert to_checkpoint < 1e-4 and to_start > 100 * to_checkpoint, (to_checkpoint, to_start)
