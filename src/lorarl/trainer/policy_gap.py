"""The trainer/vLLM logprob gap split in two (`trainer.policy_gap_interval`): "policy moved", the
trainer now against the trainer at the version that sampled the rollout, and "serving mismatch", the
trainer at that version against vLLM.

With max_async_level > 0 a rollout of version v is trained on at step N with the weights of version
N - 1, so `mismatch/logprob_abs_diff` mixes the policy's own updates since v with whatever vLLM
computes otherwise than the trainer (kernels, a stale or wrong adapter). Telling them apart needs the
trainer's logprobs under version v: the trainer keeps the LoRA weights of the versions that rollouts
may still come from (`PolicyHistory`, the last max_async_level + 1, in host memory: small beside the
model) and, every `policy_gap_interval` steps, scores the batch once more without gradient under the
current weights and once under each older version in it. Cost: no_grad forward passes of the batch
(about 1 + the share of older samples), against the training step's forward and backward passes
(docs/off_policy.md has the measured figure). LoRA only: a full fine-tune's versions are whole models.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from lorarl.config.run import RLConfig
from lorarl.rollouts import Rollout
from lorarl.trainer.batching import MicroBatch, TrainSample, micro_batches
from lorarl.trainer.loss import Nucleus, token_logprobs


def _trained(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters the optimizer updates: the active adapter's."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


@dataclass
class PolicyHistory:
    """The trained weights of the last `keep` versions, on the CPU, by version."""

    keep: int
    weights: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def for_config(cls, cfg: RLConfig) -> PolicyHistory | None:
        """The history the split needs, of the versions rollouts may come from; None without the split."""
        if cfg.trainer.policy_gap_interval is None:
            return None
        return cls(keep=cfg.orchestrator.max_async_level + 1)

    def record(self, model: torch.nn.Module, version: int) -> None:
        """Keep `model`'s trained weights as `version`, and forget versions no rollout can come from now."""
        self.weights[version] = {name: p.detach().to("cpu", copy=True) for name, p in _trained(model).items()}
        for old in [v for v in self.weights if v <= version - self.keep]:
            del self.weights[old]

    @contextmanager
    def loaded(self, model: torch.nn.Module, version: int) -> Iterator[None]:
        """`model` with the weights of `version` in place of its own, which come back on exit."""
        params = _trained(model)
        current = {name: p.detach().clone() for name, p in params.items()}
        with torch.no_grad():
            try:
                for name, p in params.items():
                    p.copy_(self.weights[version][name])
                yield
            finally:
                for name, p in params.items():
                    p.copy_(current[name])


def step_policy_gap(
    model: torch.nn.Module,
    history: PolicyHistory,
    cfg: RLConfig,
    step: int,
    rollouts: Sequence[Rollout],
    samples: Sequence[TrainSample],
    nucleus: Nucleus,
) -> dict[str, float]:
    """After step `step`'s update: the split of its batch (`samples` of `rollouts`) when due, timed as
    time/policy_gap ({} otherwise), then version `step`, which the model holds now, kept."""
    stats: dict[str, float] = {}
    if samples and step % (cfg.trainer.policy_gap_interval or 1) == 0:
        start = time.perf_counter()
        versions = [r.policy_version for r in rollouts]
        trained_with = step - 1  # the batch was scored and trained on under the version before the update
        size, chunk = cfg.trainer.micro_batch_size, cfg.trainer.logits_chunk_size
        stats = policy_gap(model, history, samples, versions, trained_with, nucleus, size, chunk)
        stats["time/policy_gap"] = time.perf_counter() - start
    history.record(model, step)
    return stats


def policy_gap(
    model: torch.nn.Module,
    history: PolicyHistory,
    samples: Sequence[TrainSample],
    versions: Sequence[int],
    now: int,
    nucleus: Nucleus,
    micro_batch_size: int,
    chunk_size: int,
) -> dict[str, float]:
    """Means over the loss tokens of `samples` (sampled by policy `versions`) of |log pi_now - log pi_v|
    ("policy moved") and |log pi_v - log pi_vLLM| ("serving"), each version's weights loaded in turn from
    `history` (the model's own come back). Samples of a version no longer kept are left out, and counted."""
    sums = {"moved": 0.0, "serving": 0.0, "tokens": 0.0}
    left_out = 0
    training = model.training
    model.eval()  # no dropout: the versions' logprobs differ by their weights only
    try:
        for version in sorted(set(versions)):
            group = [s for s, v in zip(samples, versions, strict=True) if v == version]
            if version not in history.weights or now not in history.weights:
                left_out += len(group)
                continue
            device = next(model.parameters()).device
            batches = [b.to(device) for b in micro_batches(group, micro_batch_size, pad_id=0)]
            with history.loaded(model, now):
                current = _scores(model, batches, nucleus, chunk_size)
            with history.loaded(model, version):
                at_version = _scores(model, batches, nucleus, chunk_size)
            for batch, lp_now, lp_v in zip(batches, current, at_version, strict=True):
                sums["moved"] += (lp_now - lp_v)[batch.loss_mask].abs().sum().item()
                sums["serving"] += (lp_v - batch.old_logprobs)[batch.loss_mask].abs().sum().item()
                sums["tokens"] += batch.loss_mask.sum().item()
    finally:
        model.train(training)
    n = max(sums["tokens"], 1.0)
    moved, serving = sums["moved"] / n, sums["serving"] / n
    return {"mismatch/policy_moved": moved, "mismatch/serving": serving, "mismatch/gap_left_out": left_out}


def _scores(
    model: torch.nn.Module, batches: Sequence[MicroBatch], nucleus: Nucleus, chunk_size: int
) -> list[torch.Tensor]:
    """Each batch's target logprobs under the model's weights, without gradient."""
    with torch.no_grad():
        return [token_logprobs(model, b, chunk_size, nucleus) for b in batches]
