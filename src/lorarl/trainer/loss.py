"""Token log-probabilities and the RL policy loss.

Logits are divided by the sampling temperature before the softmax, exactly as vLLM does for
`processed_logprobs`, so trainer and sampler logprobs of the same policy agree to float precision.
With top_k or top_p (`[orchestrator.sampling]`) vLLM samples from, and returns the logprobs of, the
distribution renormalized over the tokens these keep; the trainer keeps the same tokens of its own
distribution by vLLM's rule (`Nucleus`) and renormalizes alike, so that both are logprobs of the
distribution sampled from.

The loss of one step, over its samples i and their loss tokens t (`[trainer.loss]`):

    L = sum_i w_i sum_t ( c_it * g_it + kl_coef * k3_it - entropy_coef * H_it )

* g_it: the policy term, the `LossFn` that `type` names (losses.py): -f(r_it, A_i) of a built-in, or
  what a custom loss function returns.
* r_it: the importance ratio pi_trainer / pi_anchor of token t ("token"), or of sample i for all its
  tokens ("sequence": exp of the mean token log-ratio, the geometric mean of GSPO). The anchor is the
  sampler, pi_vLLM; with a mismatch correction it is the trainer before the update, pi_old.
* f: PPO's min(r A, clip(r, 1 - low, 1 + high) A) ("ppo"); r A where r is in that range and 0
  elsewhere ("mask"); sg(clip(r, 1 - low, 1 + high)) A log pi_trainer ("cispo"), sg meaning without
  gradient, so a clipped token keeps the gradient of its log pi at a capped weight; r A
  ("importance_sampling"); A log pi_trainer ("cross_entropy"). CISPO as in the MiniMax-M1 report
  (arXiv:2506.13585) and Tinker's "cispo" loss (clipped_ratio.detach() * target_logprobs * advantages).
* c_it: 1, or the truncated or masked importance weight pi_old / pi_vLLM of `mismatch_correction`,
  times the geometric-mean sample mask of `mismatch_geo_mask`, without gradient: mismatch.py, which
  says what it follows.
* k3: exp(d) - d - 1 with d = log pi_base - log pi_trainer, the non-negative k3 estimator of
  KL(pi_trainer || pi_base) used by GRPO; pi_base is the model with its adapter disabled.
* H_it: the entropy of the policy's next-token distribution at the sampling temperature.
* w_i: 1 / loss tokens of the step ("token"); 1 / (loss tokens of sample i * samples of the step)
  ("sequence", GRPO); 1 / norm_constant ("constant", Dr. GRPO).

Memory: the model's forward pass stops at its last hidden states, and the output head, the log-softmax
and the entropy run `chunk_size` targets at a time (`trainer.logits_chunk_size`), each chunk recomputed
in the backward pass (torch.utils.checkpoint), so no [targets x vocab] float32 tensor is ever whole:
with Qwen3's 151,936-token vocabulary that tensor alone is 0.6 GB per 1,000 targets, several copies of
it live in the backward pass, and rows of 8k-32k tokens would not fit where the model does. The loss
and gradients are those of the whole pass up to float rounding. Models that change their logits after
the head (e.g. Gemma 2's soft-capping) are not scored right this way.

A forward batch holds samples one per padded row (`MicroBatch`) or several per packed row
(`PackedBatch`). The loss reads both the same way: per target token, its sample's number
(`sample_index`) and advantage; sums over a sample's tokens are segment sums over that index.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import peft
import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from lorarl.config.algorithms import CustomLoss, LossBase
from lorarl.config.common import DEFAULT_LOGITS_CHUNK_SIZE
from lorarl.trainer.batching import MicroBatch, TrainSample
from lorarl.trainer.losses import LossInputs, per_sample_sum, policy_term
from lorarl.trainer.mismatch import mismatch_correction, weight_moments

if TYPE_CHECKING:
    # For annotations only: packing.py imports this module, which computes its logprobs.
    from lorarl.trainer.model import TrainedModel
    from lorarl.trainer.packing import PackedBatch


@dataclass(frozen=True)
class Nucleus:
    """The tokens vLLM samples from at each position, `[orchestrator.sampling]` top_k and top_p: top_k
    keeps the tokens whose tempered logit is at least the k-th largest; top_p then keeps, of these, the
    most likely ones, dropping those (from the least likely up) whose cumulative probability stays
    <= 1 - top_p, the most likely always kept. This is vLLM 0.32's apply_top_k_top_p_pytorch (sort
    ascending, cumsum of the softmax); its other kernels keep the same set up to float rounding. The
    sampled token is always kept: where the trainer's float rounding would drop a token vLLM kept at
    the boundary, its logprob stays finite (and the set differs by tokens of boundary mass only)."""

    top_p: float = 1.0
    top_k: int | None = None

    @property
    def everything(self) -> bool:
        return self.top_p >= 1.0 and self.top_k is None

    def keep(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """`logits` [n, vocab] with -inf on the tokens this drops (none of `targets` [n])."""
        with torch.no_grad():
            ascending, order = logits.sort(dim=-1)
            drop = torch.zeros_like(ascending, dtype=torch.bool)
            if self.top_k is not None and self.top_k < ascending.shape[-1]:
                drop = ascending < ascending[:, -self.top_k, None]
            if self.top_p < 1.0:
                cumulative = ascending.masked_fill(drop, -torch.inf).softmax(dim=-1).cumsum(dim=-1)
                drop |= cumulative <= 1 - self.top_p
                drop[:, -1] = False
            dropped = torch.empty_like(drop).scatter_(-1, order, drop)
            dropped.scatter_(-1, targets[:, None], False)
        return logits.masked_fill(dropped, -torch.inf)


EVERY_TOKEN = Nucleus()


def token_logprobs(
    model: torch.nn.Module,
    batch: MicroBatch | PackedBatch,
    chunk_size: int = DEFAULT_LOGITS_CHUNK_SIZE,
    nucleus: Nucleus = EVERY_TOKEN,
) -> torch.Tensor:
    """log p(each target | its sample's tokens before it) at the batch's temperature, over the tokens
    `nucleus` keeps: [rows, T-1]."""
    return _chunked_scores(model, batch, chunk_size, None, nucleus)[0]


def token_logprobs_and_entropy(
    model: torch.nn.Module,
    batch: MicroBatch | PackedBatch,
    with_grad: bool = False,
    chunk_size: int = DEFAULT_LOGITS_CHUNK_SIZE,
    nucleus: Nucleus = EVERY_TOKEN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs`, and the entropy of each next-token distribution at the batch's temperature
    over the tokens `nucleus` keeps (the distribution the sampler drew from), with gradient only if
    `with_grad`: [rows, T-1] each."""
    mode: Literal["with_grad", "no_grad"] = "with_grad" if with_grad else "no_grad"
    logprobs, entropy = _chunked_scores(model, batch, chunk_size, mode, nucleus)
    assert entropy is not None
    return logprobs, entropy


def _chunked_scores(
    model: torch.nn.Module,
    batch: MicroBatch | PackedBatch,
    chunk_size: int,
    entropy: Literal["with_grad", "no_grad"] | None,
    nucleus: Nucleus,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target log-probabilities (and entropies) [rows, T-1] from the model's last hidden states, the
    output head applied `chunk_size` targets at a time (module docstring: "Memory")."""
    inputs = batch.forward_inputs(model)
    hidden = _last_hidden_states(model, inputs)[:, :-1]
    rows, width = hidden.shape[:2]
    targets = inputs["input_ids"][:, 1:].reshape(-1)
    flat = hidden.reshape(rows * width, -1)
    head = cast(torch.nn.Module, cast(PreTrainedModel, model).get_output_embeddings())
    score = functools.partial(_chunk_scores, head, temperature=batch.temperature, entropy=entropy, nucleus=nucleus)
    size = chunk_size or flat.shape[0]
    # Recompute a chunk's logits in the backward pass instead of keeping them, unless one chunk is all.
    recompute = torch.is_grad_enabled() and size < flat.shape[0]
    parts = [
        checkpoint(score, h, t, use_reentrant=False) if recompute else score(h, t)
        for h, t in zip(flat.split(size), targets.split(size), strict=True)
    ]
    logprobs = torch.cat([lp for lp, _ in parts]).view(rows, width)
    if entropy is None:
        return logprobs, None
    return logprobs, torch.cat([h for _, h in parts]).view(rows, width)


def _chunk_scores(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    entropy: Literal["with_grad", "no_grad"] | None,
    nucleus: Nucleus,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each target and the entropy (zeros if not asked for) of its tempered
    next-token distribution over the tokens `nucleus` keeps, for one chunk of hidden states
    [n, hidden]: [n] each, in float32."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    if not nucleus.everything:
        logits = nucleus.keep(logits, targets)
    logprobs = torch.log_softmax(logits, dim=-1)
    target = logprobs.gather(-1, targets[:, None]).squeeze(-1)
    if entropy is None:
        return target, target.new_zeros(())
    with torch.set_grad_enabled(entropy == "with_grad" and torch.is_grad_enabled()):
        # A dropped token adds 0 to the entropy (0 * -inf would be NaN).
        finite = logprobs if nucleus.everything else logprobs.masked_fill(logits == -torch.inf, 0.0)
        return target, -(logprobs.exp() * finite).sum(-1)


def _last_hidden_states(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """The hidden states that the model's output head reads, [rows, T, hidden], from its own forward
    pass: a pre-hook on the head takes them and hands the head an empty slice instead, so the forward
    pass computes no logits (transformers' models feed the head the final normed states)."""
    head = cast(torch.nn.Module, cast(PreTrainedModel, model).get_output_embeddings())
    taken: list[torch.Tensor] = []

    def take(_: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        taken.append(args[0])
        return (args[0][..., :0, :], *args[1:])

    handle = head.register_forward_pre_hook(take)
    try:
        model(**inputs)
    finally:
        handle.remove()
    if len(taken) != 1:
        raise RuntimeError(f"{type(model).__name__} called its output head {len(taken)} times in one forward pass")
    return taken[0]


@dataclass(frozen=True)
class LossNorm:
    """The step-level denominator of `[trainer.loss] norm`. It is fixed from all of the step's samples
    before the first micro-batch, so that the micro-batch losses add up to the step's loss."""

    mode: Literal["token", "sequence", "constant"]
    # Loss tokens of the step ("token"), samples of the step with a loss token ("sequence"), or
    # norm_constant ("constant").
    denominator: float

    @classmethod
    def for_step(cls, cfg: LossBase, samples: Sequence[TrainSample]) -> LossNorm:
        # loss_mask[0] never carries loss: the first token is no model prediction (see MicroBatch).
        counts = [sum(s.loss_mask[1:]) for s in samples]
        if cfg.norm == "constant":
            assert cfg.norm_constant is not None  # LossBase's validator requires it
            return cls("constant", cfg.norm_constant)
        if cfg.norm == "sequence":
            return cls("sequence", max(1, sum(c > 0 for c in counts)))
        return cls("token", max(1, sum(counts)))

    def sample_weights(self, loss_tokens: torch.Tensor) -> torch.Tensor:
        """w_i of each sample of a forward batch, from its loss tokens [num_samples]: [num_samples]."""
        if self.mode == "sequence":
            # A sample's tokens are averaged first: every sample weighs the same, whatever its length.
            return 1.0 / (loss_tokens.clamp(min=1) * self.denominator)
        return torch.full_like(loss_tokens, 1.0 / self.denominator)


def policy_loss(
    logprobs: torch.Tensor,
    batch: MicroBatch | PackedBatch,
    cfg: LossBase,
    norm: LossNorm,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This forward batch's share of the step loss (module docstring), and its stats as means over its
    loss tokens. `logprobs`, `ref_logprobs` (the base model's: the KL penalty is added) and `entropy`
    (with gradient, needed with entropy_coef > 0) are the batch's per-target ones, [rows, T-1]."""
    token_loss, stats = policy_token_loss(logprobs, batch, cfg, norm, ref_logprobs, entropy)
    return token_loss.sum(), stats


def policy_token_loss(
    logprobs: torch.Tensor,
    batch: MicroBatch | PackedBatch,
    cfg: LossBase,
    norm: LossNorm,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`policy_loss` before the sum: each target's share of the step loss, w_i (c_it g_it + ...), 0 off
    the loss tokens, [rows, T-1]; the Tinker API answers it per target (serve/engine.py)."""
    mask = batch.loss_mask.float()
    # Zero off the loss tokens, where old_logprobs holds placeholders, so that exp() stays finite there.
    token_log_ratio = (logprobs - batch.old_logprobs) * mask
    loss_tokens = per_sample_sum(mask, batch.sample_index, batch.num_samples)
    weights = norm.sample_weights(loss_tokens)[batch.sample_index]
    n = mask.sum().clamp(min=1)
    with torch.no_grad():
        token_ratio = torch.exp(token_log_ratio)
        stats = {
            "mismatch/logprob_abs_diff": token_log_ratio.abs().sum() / n,
            # k3 estimator of KL(sampler || trainer), non-negative per token.
            "mismatch/kl": ((token_ratio - 1 - token_log_ratio) * mask).sum() / n,
            **weight_moments(token_log_ratio, mask, n),
        }
    # With a mismatch correction, pi_trainer / pi_vLLM = (pi_trainer / pi_old) (pi_old / pi_vLLM): the
    # policy term takes the first, 1 in value, and the correction c the second; neither counts twice.
    # The geometric-mean mask alone (mismatch_correction "none") leaves the ratio at pi_trainer / pi_vLLM.
    anchored = cfg.mismatch_correction != "none"
    inputs = LossInputs(
        logprobs=logprobs,
        sampler_logprobs=batch.old_logprobs,
        advantages=batch.token_advantages,
        loss_mask=batch.loss_mask,
        sample_index=batch.sample_index,
        num_samples=batch.num_samples,
        sample_weights=weights,
        cfg=cfg,
        log_ratio=(logprobs - logprobs.detach()) * mask if anchored else token_log_ratio,
    )
    per_token, term_stats = _policy_term(inputs)
    stats |= term_stats
    if anchored or cfg.mismatch_geo_mask is not None:
        log_w = token_log_ratio.detach()  # log pi_old - log pi_vLLM
        sample_log_w = per_sample_sum(log_w, batch.sample_index, batch.num_samples)
        geo_log_w = sample_log_w / loss_tokens.clamp(min=1)
        correction = mismatch_correction(log_w, sample_log_w[batch.sample_index], geo_log_w[batch.sample_index], cfg)
        per_token = per_token * correction.weights
        stats |= correction.stats(cfg, mask, n)
    if ref_logprobs is not None:
        d = (ref_logprobs - logprobs) * mask
        kl = torch.exp(d) - d - 1
        per_token = per_token + cfg.kl_coef * kl
        stats["kl_to_base"] = (kl.detach() * mask).sum() / n
    if cfg.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the entropy, with gradient (token_logprobs_and_entropy)")
        per_token = per_token - cfg.entropy_coef * entropy
    return per_token * mask * weights, stats


def _policy_term(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """g_it of every target from the loss function `[trainer.loss] type` names (losses.py), checked, off
    the loss tokens set to 0, and its metrics (a custom loss's as loss_fn/<name>)."""
    fn, kwargs = policy_term(inputs.cfg)
    out = fn(inputs, **kwargs)
    per_token, metrics = out if isinstance(out, tuple) else (out, {})
    custom = isinstance(inputs.cfg, CustomLoss)
    what = f"trainer.loss.fn {inputs.cfg.fn}" if isinstance(inputs.cfg, CustomLoss) else "the loss"
    if not isinstance(per_token, torch.Tensor) or per_token.shape != inputs.logprobs.shape:
        got = tuple(per_token.shape) if isinstance(per_token, torch.Tensor) else type(per_token).__name__
        raise TypeError(f"{what} returned {got}, not a per-token loss of shape {tuple(inputs.logprobs.shape)}")
    if bad := [k for k, v in metrics.items() if not (isinstance(v, torch.Tensor) and v.numel() == 1)]:
        raise TypeError(f"{what}: metrics {bad} are not scalar tensors")
    prefix = "loss_fn/" if custom else ""
    # Off the loss tokens whatever it computed there (a NaN times 0 would still be NaN).
    return per_token.where(inputs.loss_mask, 0.0), {f"{prefix}{k}": v.detach().reshape(()) for k, v in metrics.items()}


def micro_batch_loss(
    model: TrainedModel,
    batch: MicroBatch | PackedBatch,
    cfg: LossBase,
    norm: LossNorm,
    chunk_size: int = DEFAULT_LOGITS_CHUNK_SIZE,
    nucleus: Nucleus = EVERY_TOKEN,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward one batch, padded or packed, and return `policy_loss` with the policy's mean entropy
    added to the stats. With kl_coef > 0 the base model scores the batch first, only then: it costs a
    forward pass (of the same inputs and attention mask). With entropy_coef > 0 the entropy has a gradient.
    `chunk_size`: targets per chunk of the output head (`trainer.logits_chunk_size`); `nucleus`: the
    tokens vLLM sampled from, each model's own (so that the KL penalty is 0 where the two agree)."""
    _, token_loss, stats = micro_batch_scores(model, batch, cfg, norm, chunk_size, nucleus)
    return token_loss.sum(), stats


def micro_batch_scores(
    model: TrainedModel,
    batch: MicroBatch | PackedBatch,
    cfg: LossBase,
    norm: LossNorm,
    chunk_size: int = DEFAULT_LOGITS_CHUNK_SIZE,
    nucleus: Nucleus = EVERY_TOKEN,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """`micro_batch_loss` per target: the policy's logprobs and each target's loss (`policy_token_loss`),
    [rows, T-1] each, with gradient, and the stats."""
    ref_logprobs = None
    if cfg.kl_coef > 0:
        # The base model is the same weights with the adapter switched off: no second copy in memory
        # (full fine-tuning refuses kl_coef: RLConfig).
        assert isinstance(model, peft.PeftModel)
        with torch.no_grad(), model.disable_adapter():
            ref_logprobs = token_logprobs(model, batch, chunk_size, nucleus)
    bonus = cfg.entropy_coef > 0
    logprobs, entropy = token_logprobs_and_entropy(model, batch, bonus, chunk_size, nucleus)
    token_loss, stats = policy_token_loss(logprobs, batch, cfg, norm, ref_logprobs, entropy if bonus else None)
    mask = batch.loss_mask.float()
    stats["entropy"] = (entropy.detach() * mask).sum() / mask.sum().clamp(min=1)
    return logprobs, token_loss, stats
