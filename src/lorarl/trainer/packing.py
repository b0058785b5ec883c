"""Sample packing: several samples side by side in one row of at most `capacity` tokens.

Each sample keeps its own position ids (restarting at 0) and attends only to its own earlier
tokens, so a packed row computes exactly what the samples would compute one per row, without
the padding. Made for both trainers (`sft` and `rl`, each with its `packing` option): rows carry
the per-token loss mask and sampler logprobs, each sample's advantage on its tokens, and the
batch-wide number of the sample each token belongs to (`sample_index`), by which the RL loss
(loss.py) sums over a sample's tokens (sequence-level ratios and norms) as it does over a padded row.

Attention boundaries, as checked against transformers 5.19: for "sdpa" and "eager" the forward
pass gets an explicit 4D block-diagonal causal mask. transformers can also infer the boundaries
from position ids alone, but only when no 2D attention mask and no KV cache is given, and Qwen3
creates a cache by default (`use_cache` from its config): its position-id detection then silently
lets samples attend to each other. Other implementations (flash attention) get the position ids,
no mask and `use_cache=False`, which is the variable-length path transformers documents for them.
With a 4D mask, attention still computes the whole row (masked), at a cost that grows with the
square of the row width; flash attention's variable-length path skips the masked part.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from lorarl.trainer.batching import MicroBatch, TrainSample, by_temperature, micro_batches

# Attention implementations that take a custom 4D mask: a boolean one (True = attend) for sdpa,
# an additive float one for eager.
_EXPLICIT_MASK = ("sdpa", "eager")


@dataclass
class PackedBatch:
    """Rows of packed samples for one forward pass, right-padded to the longest row.

    Per-token fields are aligned with the *targets* `input_ids[:, 1:]`, as in `MicroBatch`. The
    target that starts a sample (predicted from the previous sample's last token) never carries
    loss. Advantages are per token (each sample's advantage on its own tokens): a per-row value
    cannot describe a row of several samples.
    """

    input_ids: torch.Tensor  # [R, L]
    position_ids: torch.Tensor  # [R, L], 0 at the start of every sample
    sequence_ids: torch.Tensor  # [R, L], the sample's number within its row; the padding is one more
    loss_mask: torch.Tensor  # [R, L-1] bool
    old_logprobs: torch.Tensor  # [R, L-1]
    token_advantages: torch.Tensor  # [R, L-1]
    # [R, L-1], the sample of each target numbered across the batch, row after row (0 to
    # num_samples - 1); the padding, which carries no loss, counts with its row's last sample.
    sample_index: torch.Tensor
    temperature: float
    num_samples: int

    def to(self, device: torch.device) -> PackedBatch:
        return PackedBatch(
            self.input_ids.to(device), self.position_ids.to(device), self.sequence_ids.to(device),
            self.loss_mask.to(device), self.old_logprobs.to(device), self.token_advantages.to(device),
            self.sample_index.to(device), self.temperature, self.num_samples,
        )  # fmt: skip

    def forward_inputs(self, model: torch.nn.Module) -> dict[str, Any]:
        """Keyword arguments of `model(...)`, on the model's device."""
        hf_model = cast(PreTrainedModel, model)  # a transformers or PEFT model
        weight = cast(torch.nn.Embedding, hf_model.get_input_embeddings()).weight
        mask = self.attention_mask(hf_model.config._attn_implementation, weight.dtype)
        device = weight.device
        return {
            "input_ids": self.input_ids.to(device),
            "position_ids": self.position_ids.to(device),
            "attention_mask": None if mask is None else mask.to(device),
            # A cache would switch off transformers' packed-sequence handling (and is useless in training).
            "use_cache": False,
        }

    def attention_mask(self, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor | None:
        """The [R, 1, L, L] block-diagonal causal mask the implementation takes, or None where the
        position ids are what marks the boundaries (see the module docstring)."""
        if attn_implementation not in _EXPLICIT_MASK:
            return None
        length = self.input_ids.shape[1]
        same_sample = self.sequence_ids[:, :, None] == self.sequence_ids[:, None, :]
        causal = torch.ones(length, length, dtype=torch.bool, device=self.input_ids.device).tril()
        allowed = (same_sample & causal)[:, None]
        if attn_implementation == "sdpa":
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into rows whose lengths sum to at most `capacity`.

    First-fit decreasing: longest samples first, each into the first row it fits, which packs
    within a few percent of the optimum for typical length distributions.
    """
    too_long = [n for n in lengths if n > capacity]
    if too_long:
        raise ValueError(f"a sample of {max(too_long)} tokens does not fit in a row of {capacity}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if row is None:
            rows.append([])
            room.append(capacity)
            row = len(rows) - 1
        rows[row].append(i)
        room[row] -= lengths[i]
    return rows


@dataclass(frozen=True)
class ForwardPasses:
    """How a trainer splits samples into forward passes: `micro_batch_size` padded samples per pass,
    or with `packing` as many packed rows of up to `seq_len` tokens (the same bound on tokens per
    pass). Either way grouped by temperature."""

    packing: bool
    seq_len: int
    micro_batch_size: int
    pad_id: int

    def split(self, samples: Sequence[TrainSample]) -> Iterator[MicroBatch | PackedBatch]:
        if not self.packing:
            return micro_batches(samples, self.micro_batch_size, self.pad_id)
        # A multi-turn sample can outgrow seq_len: the episode ends on an environment reply that filled
        # it (no loss tokens there, but still input). Such a sample gets a row of its own.
        capacity = max(self.seq_len, max((len(s.input_ids) for s in samples), default=0))
        return packed_micro_batches(samples, capacity, self.micro_batch_size, self.pad_id)

    def without_loss(self) -> MicroBatch | PackedBatch:
        """A pass without loss tokens, for a rank that has run out of its own (`same_passes`)."""
        return next(iter(self.split([TrainSample.no_loss(self.pad_id)])))


def packed_micro_batches(
    samples: Sequence[TrainSample], capacity: int, rows_per_batch: int, pad_id: int
) -> Iterator[PackedBatch]:
    """Pack `samples` into rows of at most `capacity` tokens and yield `rows_per_batch` rows at a
    time, grouped by temperature (a forward pass is scored at one temperature)."""
    for temp, group in by_temperature(samples).items():
        rows = least_padded_rows([len(s.input_ids) for s in group], capacity, rows_per_batch)
        for i in range(0, len(rows), rows_per_batch):
            yield collate_packed([[group[j] for j in row] for row in rows[i : i + rows_per_batch]], pad_id, temp)


def least_padded_rows(lengths: Sequence[int], capacity: int, rows_per_batch: int) -> list[list[int]]:
    """`pack_rows` for the row width, from the longest sample up to `capacity`, that leaves the least
    padding, longest rows first.

    A micro-batch is padded to its widest row, so rows as wide as `capacity` only pay off where the
    samples fill them: samples just over half of `capacity` long fill a row each, and the few rows
    that take two would make every row of their micro-batch that wide. The widths tried grow by a
    quarter, from the longest sample to `capacity`.
    """
    widths = [capacity]
    width = max(lengths)
    while width < capacity:
        widths.append(width)
        width = math.ceil(width * 1.25)
    best: list[list[int]] = []
    best_padded = math.inf
    for width in sorted(widths):
        rows = sorted(pack_rows(lengths, width), key=lambda row: -sum(lengths[i] for i in row))
        # Rows longest first: each micro-batch's widest row is its first.
        padded = sum(
            len(rows[i : i + rows_per_batch]) * sum(lengths[j] for j in rows[i])
            for i in range(0, len(rows), rows_per_batch)
        )
        if padded < best_padded:
            best, best_padded = rows, padded
    return best


def collate_packed(rows: Sequence[Sequence[TrainSample]], pad_id: int, temperature: float) -> PackedBatch:
    width = max(sum(len(s.input_ids) for s in row) for row in rows)
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    sequence = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    old = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    index = torch.zeros(shape, dtype=torch.long)
    first = 0  # the batch-wide number of the row's first sample
    for r, row in enumerate(rows):
        start = 0
        for k, s in enumerate(row):
            n = len(s.input_ids)
            span = slice(start, start + n)
            ids[r, span] = torch.tensor(s.input_ids)
            positions[r, span] = torch.arange(n)
            sequence[r, span] = k
            # A sample's first token is never a target of its own sample.
            loss_mask[r, span] = torch.tensor([False, *s.loss_mask[1:]])
            if s.old_logprobs is not None:
                old[r, span] = torch.tensor(s.old_logprobs)
            advantages[r, span] = s.advantage
            index[r, span] = first + k
            start += n
        # The padding is a sequence of its own: a query that may attend to nothing makes sdpa return
        # NaN, which the loss mask would not remove (NaN * 0 is NaN).
        positions[r, start:] = torch.arange(width - start)
        sequence[r, start:] = len(row)
        index[r, start:] = first + len(row) - 1
        first += len(row)
    return PackedBatch(
        input_ids=ids,
        position_ids=positions,
        sequence_ids=sequence,
        loss_mask=loss_mask[:, 1:],
        old_logprobs=old[:, 1:],
        token_advantages=advantages[:, 1:],
        sample_index=index[:, 1:],
        temperature=temperature,
        num_samples=first,
    )
