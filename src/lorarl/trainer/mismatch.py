"""Importance sampling and masking of the gap between the trainer and vLLM
(`[trainer.loss] mismatch_correction`, `mismatch_geo_mask`), apart from the trust region, and the
diagnostics of that gap. A module of its own so that loss.py reads as the loss: this is the one
factor c_it of its docstring.

vLLM samples from pi_vLLM, which differs from the trainer's policy pi_old before the update: in
numerics (kernels, batch shapes) and, with max_async_level > 0, in the policy version. The
importance ratio of the loss splits into two factors,

    pi_trainer / pi_vLLM = (pi_trainer / pi_old) * (pi_old / pi_vLLM),

the trust region acting on the first and the weight w = pi_old / pi_vLLM, without gradient, on the
policy loss of each token. Here pi_old is the trainer's own logprob under no_grad: the trainer takes
one optimizer step per batch, so the policy before the update is the current one, and
pi_trainer / pi_old is 1 in value (its gradient is that of log pi_trainer).

    "tis":    c = min(w, cap)                          truncated IS
    "mis":    c = w where w <= cap, 0 where above      masked IS
    "icepop": c = w where low <= w <= cap, 0 outside   two-sided masked IS (IcePop)

w is per token ("token"), or per sample ("sequence"): the product of its loss tokens' weights,
exp of the sum of their log-ratios, the same for every token of the sample.

`mismatch_geo_mask` = g, apart from these and with any of them (or none): every token of a sample
whose geometric-mean weight exp(mean of its loss tokens' log w) is outside [1/g, g] gets c = 0. The
geometric mean does not grow with the sample's length as the product does, so one bound fits short
and long samples.

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
* IcePop: Ling team, "Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model" (Ring-1T,
  2025): the policy term times M(k) = k where k = pi_train / pi_infer is in [alpha, beta] and 0
  outside, so tokens where the two engines disagree much either way carry no gradient.
* Geometric-mean sequence masking: verl's geometric rejection sampling (rollout_corr_math.md,
  "geo_rs") and SkyRL's off_policy_correction (sequence_mask_metric = "geometric", geo_mask_low 0.99,
  geo_mask_high 1.01 in its fully-async examples): a mask, without a weight.
* Differences from those: one cap, no lower bound for tis/mis (verl's seq_mis preset); no veto and no
  batch normalization of the weights; masked tokens stay in the loss denominators, which `LossNorm`
  fixes before the forward passes, as for ratio_mode = "mask" (verl and slime take them out); the
  weight multiplies the policy term only, not the KL penalty or the entropy bonus (as verl's pg_losses).

Diagnostics: the effective sample size of the raw token weights w, (sum w)^2 / (n sum w^2), 1 when
every w is equal and 1/n when one token holds all the weight (Kong 1992; as verl's rollout_is_eff_
sample_size), from their mean and mean square, which add up over the micro-batches of a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lorarl.config.algorithms import LossBase

# The log-weights of the diagnostics are clamped here so that their squares stay finite in float32.
_DIAGNOSTIC_LOG_W_MAX = 40.0


@dataclass(frozen=True)
class MismatchCorrection:
    """Per target [rows, T-1], without gradient: `weights` c, what each token's policy loss is
    multiplied by, `flagged`, 1.0 where w was outside its bounds (truncated or masked), and
    `geo_masked`, 1.0 where the geometric mean of the sample's weights was (`mismatch_geo_mask`)."""

    weights: torch.Tensor
    flagged: torch.Tensor
    geo_masked: torch.Tensor

    def stats(self, cfg: LossBase, mask: torch.Tensor, n: torch.Tensor) -> dict[str, torch.Tensor]:
        """Means over the loss tokens (`mask`, `n` of them): the fractions flagged and the weight."""
        stats = {"mismatch/weight_mean": (self.weights * mask).sum() / n}
        if cfg.mismatch_correction != "none":
            flagged = "mismatch/capped_frac" if cfg.mismatch_correction == "tis" else "mismatch/masked_frac"
            stats[flagged] = (self.flagged * mask).sum() / n
        if cfg.mismatch_geo_mask is not None:
            stats["mismatch/geo_masked_frac"] = (self.geo_masked * mask).sum() / n
        return stats


def mismatch_correction(
    log_w: torch.Tensor, sample_log_w: torch.Tensor, geo_log_w: torch.Tensor, cfg: LossBase
) -> MismatchCorrection:
    """The correction of `cfg` from the log-weights log pi_old - log pi_vLLM of each target [rows, T-1]:
    its own (`log_w`), the sum over its sample's loss tokens (`sample_log_w`) and their mean (`geo_log_w`)."""
    level_log_w = (sample_log_w if cfg.mismatch_level == "sequence" else log_w).detach()
    log_cap = math.log(cfg.mismatch_cap)
    above = level_log_w > log_cap
    # exp of the capped log: a sample's product of ratios may overflow, its truncation cannot.
    truncated = torch.exp(level_log_w.clamp(max=log_cap))
    if cfg.mismatch_correction == "tis":
        weights, flagged = truncated, above
    elif cfg.mismatch_correction in ("mis", "icepop"):
        low = math.log(cfg.mismatch_low) if cfg.mismatch_correction == "icepop" else -math.inf
        flagged = above | (level_log_w < low)
        weights = truncated.masked_fill(flagged, 0.0)
    else:  # "none": the geometric-mean mask alone
        weights, flagged = torch.ones_like(log_w), torch.zeros_like(log_w, dtype=torch.bool)
    geo_masked = torch.zeros_like(flagged)
    if cfg.mismatch_geo_mask is not None:
        geo_masked = geo_log_w.detach().abs() > math.log(cfg.mismatch_geo_mask)
        weights = weights.masked_fill(geo_masked, 0.0)
    return MismatchCorrection(weights, flagged.to(weights.dtype), geo_masked.to(weights.dtype))


def weight_moments(log_w: torch.Tensor, mask: torch.Tensor, n: torch.Tensor) -> dict[str, torch.Tensor]:
    """The mean and mean square of the raw token weights w = exp(`log_w`) over the loss tokens
    (`mask`, `n` of them): the step's effective sample size comes from them (`effective_sample_size`)."""
    w = torch.exp(log_w.detach().clamp(max=_DIAGNOSTIC_LOG_W_MAX)) * mask
    return {"mismatch/is_weight_mean": w.sum() / n, "mismatch/is_weight_sq_mean": (w * w).sum() / n}


def effective_sample_size(step_stats: dict[str, float]) -> dict[str, float]:
    """The step's effective sample size of the token weights, as a fraction of its loss tokens, from the
    step means of `weight_moments` in `step_stats`; {} without them (an empty step)."""
    mean, sq_mean = step_stats.get("mismatch/is_weight_mean"), step_stats.get("mismatch/is_weight_sq_mean")
    if mean is None or sq_mean is None or sq_mean <= 0:
        return {}
    return {"mismatch/ess": mean * mean / sq_mean}
