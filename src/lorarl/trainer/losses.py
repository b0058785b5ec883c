"""The built-in policy terms, g_it of loss.py's step loss, one `LossFn` per `[trainer.loss] type`.

Each is the same kind of object as a user's loss: a function of a `LossInputs`, declared
`@lorarl.plugin("loss")`, taking its arguments (the type's own config keys) as keywords, returning the
per-token loss and its metrics. `policy_term` looks up the one a config names, a built-in here or a
user's "custom" one, with the keyword arguments to call it with; the Tinker API's `loss_fn` names
(serve/) map onto the same types. The ratio r is `LossInputs.log_ratio`'s: against vLLM's policy, or
with a mismatch correction against the trainer's own before the update (mismatch.py applies c_it).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from lorarl.config.algorithms import CustomLoss, LossBase
from lorarl.plugins import fit_args, load_function, plugin

Metrics = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LossInputs:
    """What a loss function gets: the forward batch's per-target tensors, [rows, T-1] each, whether its
    rows are padded (one sample each) or packed (several). Only the loss tokens (`loss_mask`) count."""

    logprobs: torch.Tensor  # log pi_trainer at the sampling temperature, with gradient
    sampler_logprobs: torch.Tensor  # log pi_vLLM, without gradient; placeholders off the loss tokens
    advantages: torch.Tensor  # the advantage of each target (its sample's, in `rl`)
    loss_mask: torch.Tensor  # bool
    # The sample of each target, 0 to num_samples - 1 across the batch: a sum over each sample's tokens
    # is values.new_zeros(num_samples).index_add(0, sample_index.flatten(), values.flatten()).
    sample_index: torch.Tensor
    num_samples: int
    # w_i of each target's sample (`LossNorm`): the step loss is sum(loss * loss_mask * sample_weights).
    sample_weights: torch.Tensor
    cfg: LossBase  # the [trainer.loss] section: norm, kl_coef, ..., and a custom loss's args
    # log r, 0 off the loss tokens: log pi_trainer - log pi_vLLM, or with a mismatch correction
    # log pi_trainer - log pi_old, the trainer's own without gradient (0 in value, log pi_trainer's gradient).
    log_ratio: torch.Tensor

    def per_sample_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum of per-target `values` over each sample's targets: [num_samples]."""
        return per_sample_sum(values, self.sample_index, self.num_samples)

    @functools.cached_property
    def sample_loss_tokens(self) -> torch.Tensor:
        """Loss tokens of each sample: [num_samples]."""
        return self.per_sample_sum(self.loss_mask.float())

    def token_mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean of per-target `values` over the loss tokens, a scalar (0 without any)."""
        mask = self.loss_mask.float()
        return (values * mask).sum() / mask.sum().clamp(min=1)


class LossFn(Protocol):
    """A policy loss, built in or yours (`[trainer.loss] type = "custom"`, `fn = "package.module:function"`,
    declared `@lorarl.plugin("loss")`): g_it of the step loss sum_i w_i sum_t (c_it g_it + kl_coef k3_it -
    entropy_coef H_it), the policy loss of each target [rows, T-1], or it and a dict of metrics, from a
    `LossInputs` and the keyword arguments of its config (`args`). lorarl keeps it on the loss tokens,
    multiplies it by `sample_weights` and sums it, adding the KL penalty and the entropy bonus. Metrics are
    scalar tensors, means over the batch's loss tokens (the trainer weighs each micro-batch's by its loss
    tokens), the same names at every call, logged as loss_fn/<name> for a custom loss."""

    def __call__(
        self, inputs: LossInputs, /, **kwargs: Any
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


def per_sample_sum(values: torch.Tensor, sample_index: torch.Tensor, num_samples: int) -> torch.Tensor:
    """Sum of per-target `values` [rows, T-1] over each sample's targets (`sample_index`): [num_samples]."""
    return values.new_zeros(num_samples).index_add(0, sample_index.reshape(-1), values.reshape(-1))


def _ratio(inputs: LossInputs, level: str) -> torch.Tensor:
    """r per target: of the token, or ("sequence") of its sample, exp of its mean token log-ratio."""
    if level == "sequence":
        mean_log_ratio = inputs.per_sample_sum(inputs.log_ratio) / inputs.sample_loss_tokens.clamp(min=1)
        return torch.exp(mean_log_ratio)[inputs.sample_index]
    return torch.exp(inputs.log_ratio)


def _ratio_metrics(inputs: LossInputs, ratio: torch.Tensor, out_of_range: torch.Tensor | None = None) -> Metrics:
    """Of the ratio the loss uses (per token, or its sample's for every token of the sample)."""
    with torch.no_grad():
        metrics = {"ratio/mean": inputs.token_mean(ratio)}
        if out_of_range is not None:
            metrics["ratio/out_of_range_frac"] = inputs.token_mean(out_of_range)
    return metrics


def _trust_region(
    inputs: LossInputs, ratio_low: float, ratio_high: float, ratio_level: str
) -> tuple[torch.Tensor, float, float, torch.Tensor]:
    ratio = _ratio(inputs, ratio_level)
    low, high = 1.0 - ratio_low, 1.0 + ratio_high
    return ratio, low, high, ((ratio < low) | (ratio > high)).float()


@plugin("loss")
def ppo(
    inputs: LossInputs, *, ratio_low: float = 0.2, ratio_high: float = 0.28, ratio_level: str = "token"
) -> tuple[torch.Tensor, Metrics]:
    """PPO's clipped objective: -min(r A, clip(r, 1 - ratio_low, 1 + ratio_high) A)."""
    ratio, low, high, out = _trust_region(inputs, ratio_low, ratio_high, ratio_level)
    adv = inputs.advantages
    return -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv), _ratio_metrics(inputs, ratio, out)


@plugin("loss")
def mask(
    inputs: LossInputs, *, ratio_low: float = 0.2, ratio_high: float = 0.28, ratio_level: str = "token"
) -> tuple[torch.Tensor, Metrics]:
    """-r A inside the trust region; tokens (or samples) whose ratio left it carry no gradient."""
    ratio, _, _, out = _trust_region(inputs, ratio_low, ratio_high, ratio_level)
    return -ratio * inputs.advantages * (1.0 - out), _ratio_metrics(inputs, ratio, out)


@plugin("loss")
def cispo(
    inputs: LossInputs, *, ratio_low: float = 0.2, ratio_high: float = 0.28, ratio_level: str = "token"
) -> tuple[torch.Tensor, Metrics]:
    """CISPO: -sg(clip(r)) A log pi_trainer, a clipped token keeping its gradient at a capped weight."""
    ratio, low, high, out = _trust_region(inputs, ratio_low, ratio_high, ratio_level)
    per_token = -ratio.clamp(low, high).detach() * inputs.advantages * inputs.logprobs
    return per_token, _ratio_metrics(inputs, ratio, out)


@plugin("loss")
def importance_sampling(inputs: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """-r A per token, unclipped: the importance-weighted policy gradient."""
    ratio = torch.exp(inputs.log_ratio)
    return -ratio * inputs.advantages, _ratio_metrics(inputs, ratio)


@plugin("loss")
def cross_entropy(inputs: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """-A log pi_trainer per token: REINFORCE, and the negative log-likelihood where every A is 1."""
    return -inputs.advantages * inputs.logprobs, {}


BUILTIN: dict[str, LossFn] = {
    fn.__name__: cast(LossFn, fn) for fn in (ppo, mask, cispo, importance_sampling, cross_entropy)
}


def policy_term(cfg: LossBase) -> tuple[LossFn, dict[str, Any]]:
    """The function `cfg.type` names and the keyword arguments to call it with: a built-in's own keys, or
    a custom function (imported once, declared @lorarl.plugin("loss")) and its `args`, checked against
    its signature."""
    if isinstance(cfg, CustomLoss):
        return _custom(cfg.fn, json.dumps(cfg.args, sort_keys=True))
    own = type(cfg).model_fields.keys() - LossBase.model_fields.keys() - {"type"}
    return BUILTIN[type(cfg).model_fields["type"].default], {key: getattr(cfg, key) for key in own}


@functools.cache
def _custom(spec: str, args_json: str) -> tuple[LossFn, dict[str, Any]]:
    fn = cast(LossFn, load_function(spec, "trainer.loss.fn", "loss"))
    return fn, fit_args(fn, json.loads(args_json), leading=1)
