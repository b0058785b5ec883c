"""Turn token sequences into padded micro-batches for the forward pass."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TrainSample:
    """One training sample: `input_ids`, and per input token whether it carries loss, plus optional
    per-token floats aligned with `input_ids`: the sampler's logprob, and an advantage of each token
    (`token_advantages`, where tokens of one sample weigh differently, as a Tinker API client sends
    them) in place of the sample's one `advantage`."""

    input_ids: list[int]
    loss_mask: list[bool]
    old_logprobs: list[float] | None = None
    advantage: float = 0.0
    temperature: float = 1.0
    token_advantages: list[float] | None = None

    def advantages(self) -> list[float]:
        """The advantage of each input token: `token_advantages`, or the sample's on every token."""
        return self.token_advantages if self.token_advantages is not None else [self.advantage] * len(self.input_ids)

    @classmethod
    def no_loss(cls, pad_id: int) -> TrainSample:
        """Two padding tokens without a loss token: a forward/backward pass that adds nothing to the
        gradient, for a rank out of samples while others still run passes (DataParallel.same_passes)."""
        return cls(input_ids=[pad_id, pad_id], loss_mask=[False, False], old_logprobs=[0.0, 0.0])


@dataclass
class MicroBatch:
    """Samples one per row, right-padded. `num_samples`, `sample_index`, `token_advantages` and
    `forward_inputs` are what the loss reads of it and of a `PackedBatch` (packing.py) alike."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    # The rest are aligned with the *targets* input_ids[:, 1:]: [B, T-1].
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    token_advantages: torch.Tensor  # the advantage of each target (its sample's, in `rl`)
    temperature: float

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.loss_mask.to(device),
            self.old_logprobs.to(device),
            self.token_advantages.to(device),
            self.temperature,
        )

    @property
    def num_samples(self) -> int:
        return self.input_ids.shape[0]

    @property
    def sample_index(self) -> torch.Tensor:
        """The sample of each target, [B, T-1]: its row."""
        rows = torch.arange(self.num_samples, device=self.loss_mask.device)
        return rows[:, None].expand_as(self.loss_mask)

    def forward_inputs(self, model: torch.nn.Module) -> dict[str, Any]:
        """Keyword arguments of `model(...)`. Padded rows need only their padding mask, whatever the
        model; the argument is there for packed rows, whose mask depends on its attention implementation."""
        # No KV cache: nothing is generated, and gradient checkpointing would switch it off with a warning.
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "use_cache": False}


def by_temperature(samples: Sequence[TrainSample]) -> dict[float, list[TrainSample]]:
    """Samples grouped by sampling temperature, in order: a forward pass is scored at one temperature."""
    groups: dict[float, list[TrainSample]] = {}
    for s in samples:
        groups.setdefault(s.temperature, []).append(s)
    return groups


def micro_batches(samples: Sequence[TrainSample], size: int, pad_id: int) -> Iterator[MicroBatch]:
    """Right-padded micro-batches of at most `size` samples of one temperature each."""
    return (batch for _, batch in micro_batches_with_samples(samples, size, pad_id))


def micro_batches_with_samples(
    samples: Sequence[TrainSample], size: int, pad_id: int
) -> Iterator[tuple[list[TrainSample], MicroBatch]]:
    """`micro_batches`, each with its samples, one per row in order."""
    for temp, group in by_temperature(samples).items():
        for i in range(0, len(group), size):
            yield group[i : i + size], _collate(group[i : i + size], pad_id, temp)


def _collate(samples: Sequence[TrainSample], pad_id: int, temperature: float) -> MicroBatch:
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(samples), width), dtype=torch.bool)
    old = torch.zeros((len(samples), width), dtype=torch.float32)
    advantages = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        attn[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(s.loss_mask)
        if s.old_logprobs is not None:
            old[i, :n] = torch.tensor(s.old_logprobs)
        advantages[i, :n] = torch.tensor(s.advantages())
    return MicroBatch(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=loss_mask[:, 1:],
        old_logprobs=old[:, 1:],
        token_advantages=advantages[:, 1:],
        temperature=temperature,
    )
