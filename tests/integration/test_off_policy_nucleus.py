"""top_p below 1 with real vLLM: the trainer scores each token over the same kept tokens, renormalized,
as vLLM samples and reports them, so that the importance ratio is 1 on-policy (docs/off_policy.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from lorarl.rollouts import RolloutBatch
from lorarl.trainer.batching import MicroBatch, micro_batches
from lorarl.trainer.loss import EVERY_TOKEN, Nucleus, token_logprobs
from lorarl.trainer.rl import train_sample
from tests.integration.helpers import metrics, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration

TOP_P = 0.9


def test_at_top_p_the_trainer_and_vllm_logprobs_are_of_the_same_distribution(
    tiny_model: Path, vllm_server: str, tmp_path: Path
) -> None:
    cfg = rl_config(tiny_model, tmp_path, "nucleus", max_steps=2, **{"inference.urls": [vllm_server]})
    cfg["orchestrator"]["sampling"]["top_p"] = TOP_P
    cfg["orchestrator"]["delete_old_broadcasts"] = False  # version 0 scores step 1's batch below
    result = run_rl(write_config(cfg, tmp_path / "rl.json"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "nucleus"
    # max_async_level 0: each batch is scored with the weights vLLM sampled it with, so the ratio is 1.
    trainer = [r for r in metrics(run) if r["component"] == "trainer"]
    assert len(trainer) == 2 and all(r["mismatch/logprob_abs_diff"] < 1e-4 for r in trainer), trainer
    assert all(r["mismatch/ess"] == pytest.approx(1.0, abs=1e-6) for r in trainer)
    # The same tokens scored over the whole vocabulary, as the trainer did before, are far off.
    batch = step_1_batch(run)
    full, nucleus = (policy_logprobs(tiny_model, run, batch, n) for n in (EVERY_TOKEN, Nucleus(TOP_P)))
    assert (full - nucleus).abs().mean() > 1e-2
    assert (nucleus - batch.old_logprobs[batch.loss_mask]).abs().max() < 1e-4


def step_1_batch(run: Path) -> MicroBatch:
    """Step 1's rollouts as the trainer's one padded batch (their vLLM logprobs in old_logprobs)."""
    samples = [train_sample(r) for r in RolloutBatch.read(run / "rollouts" / "step_1", 1).rollouts]
    return next(micro_batches(samples, size=len(samples), pad_id=0))


def policy_logprobs(tiny_model: Path, run: Path, batch: MicroBatch, nucleus: Nucleus) -> torch.Tensor:
    """The batch's loss tokens scored over `nucleus` by the policy they were sampled with (version 0)."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, run / "broadcasts" / "step_0").eval()
    with torch.no_grad():
        return token_logprobs(model, batch, 0, nucleus)[batch.loss_mask]
