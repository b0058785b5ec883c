"""Token log-probabilities and the RL policy loss.

Logits are divided by the sampling temperature before the softmax, exactly as vLLM does for
`processed_logprobs`, so trainer and sampler logprobs of the same policy agree to float precision.
"""

from __future__ import annotations

import torch

from lorarl.config.models import LossConfig
from lorarl.trainer.batching import MicroBatch


def token_logprobs(model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) at the batch's temperature: [B, T-1]."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    logprobs = torch.log_softmax(logits.float() / batch.temperature, dim=-1)
    return logprobs.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)


def policy_loss(
    logprobs: torch.Tensor, batch: MicroBatch, cfg: LossConfig, total_loss_tokens: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy gradient with a token-level importance ratio pi_trainer / pi_sampler.

    Normalized by the number of loss tokens in the whole step (`total_loss_tokens`), so summing
    the micro-batch losses gives the per-token mean over the batch.
    """
    mask = batch.loss_mask.float()
    adv = batch.advantages[:, None]
    log_ratio = logprobs - batch.old_logprobs
    ratio = torch.exp(log_ratio)
    low, high = 1.0 - cfg.ratio_low, 1.0 + cfg.ratio_high
    out_of_range = ((ratio < low) | (ratio > high)).float()
    if cfg.ratio_mode == "clip":
        per_token = -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    else:  # "mask": tokens whose ratio left the trust region carry no gradient
        per_token = -ratio * adv * (1.0 - out_of_range)
    loss = (per_token * mask).sum() / total_loss_tokens
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = {
            "mismatch/logprob_abs_diff": (log_ratio.abs() * mask).sum() / n,
            # k3 estimator of KL(sampler || trainer), non-negative per token.
            "mismatch/kl": ((ratio - 1 - log_ratio) * mask).sum() / n,
            "ratio/out_of_range_frac": (out_of_range * mask).sum() / n,
            "ratio/mean": (ratio * mask).sum() / n,
        }
    return loss, stats
