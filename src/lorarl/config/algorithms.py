"""The algorithm family: the policy loss (`[trainer.loss]`) and the advantage estimator
(`[orchestrator.advantage]`), each chosen by `type` with arguments of its own, as prime-rl's losses.

    [trainer.loss]            type = "cispo", ratio_high = 4.0
    [orchestrator.advantage]  type = "rloo"
    [trainer.loss]            type = "custom", fn = "my_pkg.losses:clipped", args = { beta = 0.1 }

Every type is a section class behind a discriminated union, so a key that the chosen type does not take
is an unknown key, and each type's docstring is its documentation. The built-in types and a user's
"custom" one name functions of the same kind, declared `@lorarl.plugin(...)` alike (trainer/losses.py,
orchestrator/advantages.py); a custom function gets `args` as keyword arguments. The keys of the flat
sections that came before (`ratio_mode`, `loss_fn`, `estimator`, `fn` alone, `std_normalize`) still work
for one release, with one warning line naming the new spelling (`upgrade_loss`, `upgrade_advantage`).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from lorarl.config.common import Section, module_function

ModuleFunction = Annotated[str, AfterValidator(module_function)]
LOSS_TYPE = """The policy loss: "ppo", "mask", "cispo", "importance_sampling", "cross_entropy" or "custom"; each
type's own keys are listed under it."""
ADVANTAGE_TYPE = """The estimator: "grpo", "dr_grpo", "rloo" or "custom"; each type's own keys are listed under it. A
group whose rewards are all equal gets advantages of exactly 0 from each built-in."""


class LossBase(Section):
    """What every policy loss shares: the normalization, the KL penalty, the entropy bonus and the
    trainer-vLLM mismatch correction around the policy term that `type` picks."""

    norm: Literal["token", "sequence", "constant"] = "token"
    """What the loss summed over loss tokens is divided by: "token": the step's loss tokens; "sequence":
    each sample's loss tokens, then the step's samples (as GRPO); "constant": norm_constant (as Dr. GRPO)."""
    norm_constant: float | None = Field(None, gt=0)
    """The divisor of norm = "constant", e.g. batch_size * max_tokens; None: unset, which only the other
    norms allow."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a per-token KL penalty to the base model, the k3 estimator exp(d) - d - 1 with
    d = log π_base - log π_trainer, where π_base is the same weights with the adapter disabled. 0: no
    penalty; above 0 it costs one more forward per micro-batch and is logged as kl_to_base."""
    entropy_coef: float = Field(0.0, ge=0)
    """Weight of an entropy bonus: entropy_coef times the entropy of the policy at the sampling temperature
    is subtracted from each loss token's loss, normalized as the policy term (norm). 0: no bonus; above 0
    the entropy is computed with gradient, which keeps one more tokens x vocabulary tensor for the backward."""
    mismatch_correction: Literal["none", "tis", "mis", "icepop"] = "none"
    """Importance sampling of the gap between the trainer and vLLM, apart from the trust region, by the
    weight w = π_old / π_vLLM without gradient, where π_old is the trainer's policy before this step's
    update (per token or per sample: mismatch_level). "tis": truncated IS, each token's policy loss times
    min(w, mismatch_cap); "mis": masked IS, times w where w <= mismatch_cap and 0 above; "icepop": IcePop's
    two-sided masked IS, times w where mismatch_low <= w <= mismatch_cap and 0 outside. The policy term's
    ratio is then π_trainer / π_old, which is 1 at the trainer's one update per batch, so a trust region
    no longer clips or masks. Logged as mismatch/capped_frac ("tis") or mismatch/masked_frac and
    mismatch/weight_mean. "none": the policy term's ratio is π_trainer / π_vLLM itself."""
    mismatch_cap: float = Field(2.0, ge=1)
    """The cap of mismatch_correction: weights w above it are truncated to it ("tis") or zeroed ("mis",
    "icepop")."""
    mismatch_low: float = Field(0.5, gt=0, le=1)
    """The lower bound of mismatch_correction = "icepop": weights w below it are zeroed."""
    mismatch_geo_mask: float | None = Field(None, gt=1)
    """Geometric-mean sequence masking, with any mismatch_correction or none: a sample whose geometric-mean
    weight exp(mean over its loss tokens of log π_old - log π_vLLM) is outside [1 / mismatch_geo_mask,
    mismatch_geo_mask] carries no policy gradient (SkyRL's geometric sequence mask, e.g. 1.01). Logged as
    mismatch/geo_masked_frac, the fraction of loss tokens in masked samples. None: no such mask."""
    mismatch_level: Literal["token", "sequence"] = "token"
    """What the mismatch weight w is taken of: "token": each token; "sequence": each sample, the product of
    its loss tokens' weights (the sample's likelihood ratio, not GSPO's geometric mean), for all its tokens."""
    # The flat section's keys, read for one release (upgrade_loss turns them into a type before they get
    # here, so they are always None), declared so that their command-line flags parse too.
    ratio_mode: Literal["clip", "mask", "cispo"] | None = Field(None, exclude=True)
    """Deprecated: write type = "ppo" (for "clip"), "mask" or "cispo"."""
    loss_fn: str | None = Field(None, exclude=True)
    """Deprecated: write type = "custom" and fn."""

    @model_validator(mode="after")
    def _constant_norm_has_its_constant(self) -> LossBase:
        if self.norm == "constant" and self.norm_constant is None:
            raise ValueError('norm = "constant" needs norm_constant (e.g. batch_size * max_tokens)')
        return self

    @model_validator(mode="after")
    def _no_key_that_does_nothing(self) -> LossBase:
        # A bound set where the chosen correction reads none of it: the user believes tokens are masked or
        # capped, and nothing is (the default value passes: a file cannot tell it from an unset key).
        unread = [
            f"{key} = {getattr(self, key)}"
            for key, read_by in (("mismatch_cap", ("tis", "mis", "icepop")), ("mismatch_low", ("icepop",)))
            if self.mismatch_correction not in read_by and getattr(self, key) != type(self).model_fields[key].default
        ]
        if unread:
            raise ValueError(
                f'{", ".join(unread)} does nothing with mismatch_correction = "{self.mismatch_correction}" '
                '(mismatch_low: "icepop" only; mismatch_cap: "tis", "mis", "icepop"): choose the correction, '
                "or leave the key out"
            )
        if self.norm_constant is not None and self.norm != "constant":
            raise ValueError(
                f'norm_constant = {self.norm_constant} does nothing with norm = "{self.norm}": set norm = '
                '"constant", or leave norm_constant out'
            )
        return self

    @model_validator(mode="after")
    def _icepop_keeps_some_weights(self) -> LossBase:
        # mismatch_low <= 1 <= mismatch_cap: equal, only w == 1 exactly would be kept, so every token is masked.
        if self.mismatch_correction == "icepop" and self.mismatch_low >= self.mismatch_cap:
            raise ValueError(
                f"mismatch_low {self.mismatch_low} = mismatch_cap {self.mismatch_cap} masks every token "
                '(mismatch_correction = "icepop" keeps mismatch_low <= w <= mismatch_cap): lower mismatch_low'
            )
        return self


class TrustRegionLoss(LossBase):
    """A policy term of the importance ratio r = π_trainer / π_anchor with a trust region
    [1 - ratio_low, 1 + ratio_high]."""

    ratio_level: Literal["token", "sequence"] = "token"
    """What the importance ratio is taken of: "token": each token; "sequence": each sample, exp of the mean
    token log-ratio over its loss tokens (the geometric mean of GSPO, which uses a far narrower region,
    e.g. ratio_low 3e-4, ratio_high 4e-4)."""
    ratio_low: float = Field(0.2, ge=0)
    """Lower width of the trust region: ratios below 1 - ratio_low are clipped or masked."""
    ratio_high: float = Field(0.28, ge=0)
    """Upper width of the trust region: ratios above 1 + ratio_high are clipped or masked."""


class PPOLoss(TrustRegionLoss):
    """PPO's clipped objective, -min(r A, clip(r, 1 - ratio_low, 1 + ratio_high) A) per token (DAPO's
    asymmetric clip by default; GSPO with ratio_level = "sequence")."""

    type: Literal["ppo"] = Field("ppo", description=LOSS_TYPE)


class MaskLoss(TrustRegionLoss):
    """-r A where the ratio is inside the trust region, and no gradient where it left it."""

    type: Literal["mask"] = Field("mask", description=LOSS_TYPE)


class CISPOLoss(TrustRegionLoss):
    """CISPO (MiniMax-M1, arXiv:2506.13585; Tinker's "cispo"): -sg(clip(r)) A log π_trainer per token, so
    a clipped token keeps the gradient of its log π at a capped weight without gradient (sg)."""

    type: Literal["cispo"] = Field("cispo", description=LOSS_TYPE)


class ImportanceSamplingLoss(LossBase):
    """-r A per token, no trust region (Tinker's "importance_sampling"): the off-policy policy gradient."""

    type: Literal["importance_sampling"] = Field("importance_sampling", description=LOSS_TYPE)


class CrossEntropyLoss(LossBase):
    """-A log π_trainer per token (Tinker's "cross_entropy" with the advantages as its weights): REINFORCE,
    exact on-policy only, and supervised learning where every advantage is 1."""

    type: Literal["cross_entropy"] = Field("cross_entropy", description=LOSS_TYPE)


class CustomLoss(LossBase):
    """Your own policy term: a function declared @lorarl.plugin("loss") (a lorarl.LossFn) of a
    lorarl.LossInputs, returning the per-token loss, or it and a dict of scalar metrics (means over the
    batch's loss tokens, logged as loss_fn/<name>). lorarl still applies norm and adds the KL penalty and
    the entropy bonus; the function gets the vLLM logprobs and corrects for them itself."""

    type: Literal["custom"] = Field("custom", description=LOSS_TYPE)
    fn: ModuleFunction
    """The function, "package.module:function"."""
    args: dict[str, Any] = {}
    """Keyword arguments the function is called with, checked against its signature and annotations
    before the run starts; {}: none."""

    @model_validator(mode="after")
    def _corrects_for_itself(self) -> CustomLoss:
        if self.mismatch_correction != "none":
            raise ValueError(
                f"fn {self.fn} gets the vLLM logprobs and corrects for them itself: "
                f'mismatch_correction = "{self.mismatch_correction}" would correct twice; leave it "none"'
            )
        if self.mismatch_geo_mask is not None:
            raise ValueError(
                f"fn {self.fn} gets the vLLM logprobs and masks for them itself: leave mismatch_geo_mask out"
            )
        return self


LossTypes = PPOLoss | MaskLoss | CISPOLoss | ImportanceSamplingLoss | CrossEntropyLoss | CustomLoss
LossConfig = Annotated[LossTypes, Field(discriminator="type")]
"""`[trainer.loss]`: one of the loss types, by `type` ("ppo" when left out)."""
LOSS_TYPES: dict[str, type[LossBase]] = {
    cls.model_fields["type"].default: cls
    for cls in (PPOLoss, MaskLoss, CISPOLoss, ImportanceSamplingLoss, CrossEntropyLoss, CustomLoss)
}


class AdvantageBase(Section):
    # The flat section's keys, read for one release (upgrade_advantage turns them into a type before they
    # get here, so they are always None), declared so that their command-line flags parse too.
    estimator: Literal["grpo", "dr_grpo", "rloo"] | None = Field(None, exclude=True)
    """Deprecated: write type."""
    std_normalize: bool | None = Field(None, exclude=True)
    """Deprecated: write type = "grpo" (true) or "dr_grpo" (false)."""


class GRPOAdvantage(AdvantageBase):
    """GRPO: (r_i - group mean) / (group std + eps)."""

    type: Literal["grpo"] = Field("grpo", description=ADVANTAGE_TYPE)
    eps: float = Field(1e-6, gt=0)
    """Added to the group's standard deviation, so that a group of nearly equal rewards stays finite."""


class DrGRPOAdvantage(AdvantageBase):
    """Dr. GRPO: r_i - group mean, unscaled."""

    type: Literal["dr_grpo"] = Field("dr_grpo", description=ADVANTAGE_TYPE)


class RLOOAdvantage(AdvantageBase):
    """RLOO: r_i - the mean of the group's other rewards (leave-one-out)."""

    type: Literal["rloo"] = Field("rloo", description=ADVANTAGE_TYPE)


class CustomAdvantage(AdvantageBase):
    """Your own estimator: a function declared @lorarl.plugin("advantage") (lorarl.AdvantageFn), called
    with the group's rewards (a list of floats) and, if it takes a second positional argument, the group's
    episodes (lorarl.PlayedEpisode: `.episode` with the messages and example, `.model_tokens`,
    `.truncated`); it returns one finite advantage per reward. Imported when the orchestrator starts."""

    type: Literal["custom"] = Field("custom", description=ADVANTAGE_TYPE)
    fn: ModuleFunction
    """The function, "package.module:function"."""
    args: dict[str, Any] = {}
    """Keyword arguments the function is called with after the rewards (and episodes), checked against
    its signature and annotations before the run starts; {}: none."""


AdvantageConfig = Annotated[
    GRPOAdvantage | DrGRPOAdvantage | RLOOAdvantage | CustomAdvantage, Field(discriminator="type")
]
"""`[orchestrator.advantage]`: one of the estimators, by `type` ("grpo" when left out)."""

_warned: set[str] = set()


def _deprecated(old: str, new: str) -> None:
    """One warning line per old key and process: the keys still work for one release."""
    if old not in _warned:
        _warned.add(old)
        print(f"warning: {old} is deprecated and will go in the next release: write {new}", file=sys.stderr)


def _chosen_type(data: dict[str, Any], old: str, chosen: str) -> dict[str, Any]:
    """`data` with the type that an old key (`old`, as written) chose, refused where `type` differs."""
    if data.get("type", chosen) != chosen:
        raise ValueError(f"{old} chooses type {chosen!r}, but type = {data['type']!r}: keep type alone")
    return {**data, "type": chosen}


_RATIO_MODES = {"clip": "ppo", "mask": "mask", "cispo": "cispo"}


def upgrade_loss(data: Any, default: str | None = "ppo") -> Any:
    """`[trainer.loss]` as given, with the keys of the flat section that came before turned into the
    type they chose (`ratio_mode`, `loss_fn`), and the `default` type where none is given (None: none)."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if "loss_fn" in data:
        _deprecated("trainer.loss.loss_fn", 'trainer.loss.type = "custom" and trainer.loss.fn')
        if (fn := data.pop("loss_fn")) is not None:
            data = _chosen_type(data, f"loss_fn = {fn!r}", "custom") | {"fn": fn}
    if "ratio_mode" in data:
        mode = data.pop("ratio_mode")
        if mode not in _RATIO_MODES:
            raise ValueError(f"ratio_mode = {mode!r}: write type = one of {sorted(LOSS_TYPES)}")
        _deprecated("trainer.loss.ratio_mode", f'trainer.loss.type = "{_RATIO_MODES[mode]}"')
        data = _chosen_type(data, f"ratio_mode = {mode!r}", _RATIO_MODES[mode])
    return data if default is None else {"type": default, **data}


def upgrade_advantage(data: Any) -> Any:
    """`[orchestrator.advantage]` as given, with the keys of the flat section that came before
    (`estimator`, `fn` without a type, `std_normalize`) turned into the type they chose, and "grpo" where
    no type is given."""
    if not isinstance(data, dict):
        return data
    data, section = dict(data), "orchestrator.advantage"
    if "std_normalize" in data:
        _deprecated(f"{section}.std_normalize", f'{section}.type = "grpo" or "dr_grpo"')
        if (normalize := data.pop("std_normalize")) is not None:
            chosen = "grpo" if normalize else "dr_grpo"
            if "fn" in data or data.get("estimator", chosen) not in ("grpo", chosen):
                other = f"fn = {data['fn']!r}" if "fn" in data else f"estimator = {data['estimator']!r}"
                raise ValueError(f"std_normalize = {str(normalize).lower()} does not go with {other}: leave it out")
            data = _chosen_type(data, f"std_normalize = {str(normalize).lower()}", chosen)
            data.pop("estimator", None)
    if "fn" in data and "type" not in data:
        _deprecated(f"{section}.fn without a type", f'{section}.type = "custom" beside fn')
        if data.get("estimator", "grpo") != "grpo":
            raise ValueError(f"fn replaces the estimator: set fn or estimator = {data['estimator']!r}, not both")
        data.pop("estimator", None)
        data["type"] = "custom"
    if "estimator" in data:
        estimator = data.pop("estimator")
        _deprecated(f"{section}.estimator", f'{section}.type = "{estimator}"')
        data = _chosen_type(data, f"estimator = {estimator!r}", estimator)
    return {"type": "grpo", **data}
