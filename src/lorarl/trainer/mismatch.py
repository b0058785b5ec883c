"""Truncated and masked importance sampling of the gap between the trainer and vLLM
(`[trainer.loss] mismatch_correction`), apart from the trust region. A module of its own so that
loss.py reads as the loss: this is the one factor c_it of its docstring.

vLLM samples from pi_vLLM, which differs from the trainer's policy pi_old before the update: in
numerics (kernels, batch shapes) and, with max_async_level > 0, in the policy version. The
importance ratio of the loss splits into two factors,

    pi_trainer / pi_vLLM = (pi_trainer / pi_old) * (pi_old / pi_vLLM),

the trust region acting on the first and the weight w = pi_old / pi_vLLM, without gradient, on the
policy loss of each token. Here pi_old is the trainer's own logprob under no_grad: the trainer takes
one optimizer step per batch, so the policy before the update is the current one, and
pi_trainer / pi_old is 1 in value (its gradient is that of log pi_trainer).

    "tis": c = min(w, cap)                     truncated IS
    "mis": c = w where w <= cap, 0 where above   masked IS

w is per token ("token"), or per sample ("sequence"): the product of its loss tokens' weights,
exp of the sum of their log-ratios, the same for every token of the sample.

What this follows:
* TIS: F. Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
  (2025, fengyao.notion.site/off-policy-rl): the policy-gradient term times
  min(pi_trainer_old / pi_vllm, C), with the PPO ratio taken against the trainer's pi_old.
* MIS: J. Liu, Y. Li et al., "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch" (2025), as implemented in verl's rollout correction
  (docs/algo/rollout_corr.md and rollout_corr_math.md: the "decoupled" mode, IS weight
  pi_old / pi_rollout, token level, sequence level = product of the token ratios, typical cap 2)
  and slime's examples/train_infer_mismatch_helper/mis.py ("truncate": weight clamped at the upper
  bound; "mask": weight kept, tokens outside the bounds rejected).
* Differences from those: one cap, no lower bound (verl's seq_mis preset); no veto and no batch
  normalization of the weights; masked tokens stay in the loss denominators, which `LossNorm` fixes
  before the forward passes, as for ratio_mode = "mask" (verl and slime take them out); the weight
  multiplies the policy term only, not the KL penalty or the entropy bonus (as verl's pg_losses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lorarl.config.models import LossConfig


@dataclass(frozen=True)
class MismatchCorrection:
    """Per target [rows, T-1], without gradient: `weights` c, what each token's policy loss is
    multiplied by, and `flagged`, 1.0 where w was above the cap (truncated or masked)."""

    weights: torch.Tensor
    flagged: torch.Tensor

    def stats(self, cfg: LossConfig, mask: torch.Tensor, n: torch.Tensor) -> dict[str, torch.Tensor]:
        """Means over the loss tokens (`mask`, `n` of them): the fraction flagged and the weight."""
        flagged = "mismatch/capped_frac" if cfg.mismatch_correction == "tis" else "mismatch/masked_frac"
        return {
            flagged: (self.flagged * mask).sum() / n,
            "mismatch/weight_mean": (self.weights * mask).sum() / n,
        }


def mismatch_correction(log_w: torch.Tensor, cfg: LossConfig) -> MismatchCorrection:
    """The correction of `cfg.mismatch_correction` ("tis" or "mis") from the log-weight
    log pi_old - log pi_vLLM of each target, its own or its sample's (mismatch_level): [rows, T-1]."""
    log_w = log_w.detach()
    log_cap = math.log(cfg.mismatch_cap)
    above = log_w > log_cap
    # exp of the capped log: a sample's product of ratios may overflow, its truncation cannot.
    truncated = torch.exp(log_w.clamp(max=log_cap))
    weights = truncated if cfg.mismatch_correction == "tis" else truncated.masked_fill(above, 0.0)
    return MismatchCorrection(weights, above.to(weights.dtype))
