"""Sample packing: several samples side by side in one row of at most `capacity` tokens.

Each sample keeps its own position ids (restarting at 0) and attends only to its own earlier
tokens, so a packed row computes exactly what the samples would compute one per row, without
the padding. Made for both trainers (`sft` and `rl`, each with its `packing` option): rows carry
the per-token loss mask and sampler logprobs, each sample's advantage on its tokens, and the
batch-wide number of the sample each token belongs to (`sample_index`), by which the RL loss
(loss.py) sums over a sample's tokens (sequence-level ratios and norms) as it does over a padded row.

Attention boundaries, as checked against transformers 5.19 (attention.py has the paths that skip what
a row masks out):
* "packed_sdpa" (the default): each segment (sample, shared prompt) attends on its own, through
  sdpa, at the cost of the samples; the forward pass gets the segments (`Segments`), no mask. Rows
  of at most DENSE_ROWS_UP_TO tokens get sdpa's mask instead: there one kernel call per row costs
  less than one per sample (docs/attention.md).
* "flex_attention": a FlexAttention block mask from the segment ids; GPUs only (no CPU backward).
* "sdpa" and "eager": an explicit 4D block-diagonal causal mask, which costs memory and time in the
  square of the row width. transformers can also infer the boundaries from position ids alone, but
  only when no 2D attention mask and no KV cache is given, and Qwen3 creates a cache by default
  (`use_cache` from its config): its position-id detection then silently lets samples attend to
  each other.
* Other implementations (flash attention) get the position ids, no mask and `use_cache=False`,
  which is the variable-length path transformers documents for them; they cannot share prompts.

Shared prompts (`share_prompts`, RL's default where the attention implementation takes them): the
rollouts of a GRPO group start with the same prompt, so a packed row holds it once (`SharedPrompt`):
the prompt but its last token, then for each rollout its last prompt token and its completion, with
position ids continuing the prompt's and attention to the shared tokens and its own. The shared
tokens carry no loss and their hidden states are those each rollout would compute (causal
attention), and gradients through them add up over the rollouts as they would one row each: the same
loss and gradients up to float rounding, for a group of n rollouts one prompt and n completions of
compute instead of n of each. Repeating the last prompt token keeps every target predicted from the
token before it in the row, as elsewhere. Such a row may be up to `SHARED_ROW_FACTOR` x seq_len
wide, with proportionally fewer rows per pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from lorarl.trainer.attention import PACKED_SDPA, SEGMENTS_KWARG, Segments, flex_block_mask
from lorarl.trainer.batching import MicroBatch, TrainSample, by_temperature, micro_batches_with_samples

# Attention implementations that take a custom 4D mask: a boolean one (True = attend) for sdpa,
# an additive float one for eager.
_EXPLICIT_MASK = ("sdpa", "eager")
# Row width up to which packed_sdpa passes the dense mask: measured on 2 CPU threads, the mask costs
# 0.3-0.9x packed_sdpa's time at 128 tokens and is about even at 512 (docs/attention.md).
DENSE_ROWS_UP_TO = 256
# Those that see shared prompts (module docstring); the others find the boundaries from position ids.
_SEES_SHARED_PROMPTS = (PACKED_SDPA, "flex_attention", *_EXPLICIT_MASK)
# How much wider than seq_len a row of shared prompts may grow: with a dense mask, attention over a row
# is quadratic in its width, the rest of the model linear.
SHARED_ROW_FACTOR = 2


def sees_shared_prompts(attn_implementation: str) -> bool:
    """Whether packed rows can share prompts with this attention implementation: whether it is told
    which segment a token attends to, not just where samples start (by their position ids)."""
    return attn_implementation in _SEES_SHARED_PROMPTS


@dataclass(frozen=True)
class SharedPrompt:
    """Samples that start with the same `prefix_len` tokens, none of them a loss token, packed with
    those tokens once (module docstring)."""

    prefix_len: int
    samples: tuple[TrainSample, ...]

    @property
    def length(self) -> int:
        return self.prefix_len + sum(len(s.input_ids) - self.prefix_len for s in self.samples)


Unit = TrainSample | SharedPrompt
"""What packing places in a row: a sample, or samples with their shared prompt."""


def unit_length(unit: Unit) -> int:
    return unit.length if isinstance(unit, SharedPrompt) else len(unit.input_ids)


def unit_samples(unit: Unit) -> tuple[TrainSample, ...]:
    return unit.samples if isinstance(unit, SharedPrompt) else (unit,)


@dataclass
class PackedBatch:
    """Rows of packed samples for one forward pass, right-padded to the longest row.

    Per-token fields are aligned with the *targets* `input_ids[:, 1:]`, as in `MicroBatch`. The
    target that starts a sample (predicted from the previous sample's last token) never carries
    loss. Advantages are per token (each sample's advantage on its own tokens): a per-row value
    cannot describe a row of several samples.
    """

    input_ids: torch.Tensor  # [R, L]
    position_ids: torch.Tensor  # [R, L], 0 at the start of every sample (or of its shared prompt)
    sequence_ids: torch.Tensor  # [R, L], the segment's number within its row (a sample, or a shared prompt)
    # [R, L], the segment a token attends to besides its own: the shared prompt of its sample, or
    # its own segment where there is none.
    prefix_ids: torch.Tensor
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
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.sequence_ids.to(device),
            self.prefix_ids.to(device),
            self.loss_mask.to(device),
            self.old_logprobs.to(device),
            self.token_advantages.to(device),
            self.sample_index.to(device),
            self.temperature,
            self.num_samples,
        )

    def forward_inputs(self, model: torch.nn.Module) -> dict[str, Any]:
        """Keyword arguments of `model(...)`, on the model's device."""
        hf_model = cast(PreTrainedModel, model)  # a transformers or PEFT model
        embeddings = cast(torch.nn.Embedding, hf_model.get_input_embeddings())
        device = embeddings.weight.device
        # A 4-bit embedding (model.quantization) stores bytes and outputs its `dtype`.
        dtype = getattr(embeddings, "dtype", embeddings.weight.dtype)
        return {
            "input_ids": self.input_ids.to(device),
            "position_ids": self.position_ids.to(device),
            **self.attention_inputs(hf_model.config._attn_implementation, dtype, device),
            # A cache would switch off transformers' packed-sequence handling (and is useless in training).
            "use_cache": False,
        }

    def attention_inputs(self, attn_implementation: str, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        """What tells the attention implementation the segments of the rows (module docstring): the
        segments themselves, a FlexAttention block mask, a 4D mask, or nothing (the position ids)."""
        if attn_implementation == PACKED_SDPA:
            if self.input_ids.shape[1] <= DENSE_ROWS_UP_TO:  # packed_sdpa hands a mask to plain sdpa
                return {"attention_mask": self.attention_mask("sdpa", dtype).to(device)}  # type: ignore[union-attr]
            return {"attention_mask": None, SEGMENTS_KWARG: Segments.of(self.sequence_ids, self.prefix_ids)}
        if attn_implementation == "flex_attention":
            if device.type == "cpu" and torch.is_grad_enabled():
                raise ValueError(
                    f"flex_attention cannot train on the CPU (torch {torch.__version__} has no FlexAttention "
                    f"backward there): set model.attn_implementation = {PACKED_SDPA!r}"
                )
            return {"attention_mask": flex_block_mask(self.sequence_ids.to(device), self.prefix_ids.to(device))}
        mask = self.attention_mask(attn_implementation, dtype)
        return {"attention_mask": None if mask is None else mask.to(device)}

    def attention_mask(self, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor | None:
        """The [R, 1, L, L] block-diagonal causal mask that "sdpa" and "eager" take, or None where the
        position ids are what marks the boundaries (see the module docstring)."""
        if attn_implementation not in _EXPLICIT_MASK:
            if not torch.equal(self.prefix_ids, self.sequence_ids):
                raise ValueError(f"shared prompts need an attention mask, which {attn_implementation!r} does not take")
            return None
        length = self.input_ids.shape[1]
        same_sample = self.sequence_ids[:, :, None] == self.sequence_ids[:, None, :]
        shared = self.prefix_ids[:, :, None] == self.sequence_ids[:, None, :]
        causal = torch.ones(length, length, dtype=torch.bool, device=self.input_ids.device).tril()
        allowed = ((same_sample | shared) & causal)[:, None]
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
    pass), with `share_prompts` each group's prompt once (module docstring). Either way grouped by
    temperature."""

    packing: bool
    seq_len: int
    micro_batch_size: int
    pad_id: int
    share_prompts: bool = False

    def split(self, samples: Sequence[TrainSample]) -> Iterator[MicroBatch | PackedBatch]:
        return (batch for _, batch in self.split_with_samples(samples))

    def split_with_samples(
        self, samples: Sequence[TrainSample]
    ) -> Iterator[tuple[list[TrainSample], MicroBatch | PackedBatch]]:
        """`split`, each pass with its samples in the order of its `sample_index` (packing reorders
        them), for a caller that reads results per sample."""
        if not self.packing:
            return micro_batches_with_samples(samples, self.micro_batch_size, self.pad_id)
        # A multi-turn sample can outgrow seq_len: the episode ends on an environment reply that filled
        # it (no loss tokens there, but still input). Such a sample gets a row of its own.
        capacity = max(self.seq_len, max((len(s.input_ids) for s in samples), default=0))
        return packed_with_samples(samples, capacity, self.micro_batch_size, self.pad_id, self.share_prompts)

    def without_loss(self) -> MicroBatch | PackedBatch:
        """A pass without loss tokens, for a rank that has run out of its own (`same_passes`)."""
        return next(iter(self.split([TrainSample.no_loss(self.pad_id)])))


def packed_micro_batches(
    samples: Sequence[TrainSample], capacity: int, rows_per_batch: int, pad_id: int, share_prompts: bool = False
) -> Iterator[PackedBatch]:
    """Pack `samples` into rows of at most `capacity` tokens and yield `rows_per_batch` rows at a
    time, grouped by temperature (a forward pass is scored at one temperature). With `share_prompts`,
    rows of up to `SHARED_ROW_FACTOR` x `capacity` tokens, as many fewer per pass."""
    return (batch for _, batch in packed_with_samples(samples, capacity, rows_per_batch, pad_id, share_prompts))


def packed_with_samples(
    samples: Sequence[TrainSample], capacity: int, rows_per_batch: int, pad_id: int, share_prompts: bool = False
) -> Iterator[tuple[list[TrainSample], PackedBatch]]:
    """`packed_micro_batches`, each with its samples in the order of its `sample_index`."""
    for temp, group in by_temperature(samples).items():
        units = shared_prompts(group, SHARED_ROW_FACTOR * capacity) if share_prompts else list(group)
        lengths = [unit_length(u) for u in units]
        width = max(capacity, *lengths)
        per_pass = max(1, rows_per_batch * capacity // width)
        rows = least_padded_rows(lengths, width, per_pass)
        for i in range(0, len(rows), per_pass):
            packed = [[units[j] for j in row] for row in rows[i : i + per_pass]]
            in_order = [s for row in packed for unit in row for s in unit_samples(unit)]
            yield in_order, collate_packed(packed, pad_id, temp)


def shared_prompts(samples: Sequence[TrainSample], max_length: int) -> list[Unit]:
    """`samples`, those that start with the same prompt gathered into `SharedPrompt`s of at most
    `max_length` tokens (a group too long for one is split), the others as they are."""
    by_prefix: dict[tuple[int, ...], list[TrainSample]] = {}
    units: list[Unit] = []
    for s in samples:
        n = shareable_prefix(s)
        if n > 0:
            by_prefix.setdefault(tuple(s.input_ids[:n]), []).append(s)
        else:
            units.append(s)
    for prefix, group in by_prefix.items():
        chunks: list[list[TrainSample]] = [[]]
        length = len(prefix)
        for s in group:
            rest = len(s.input_ids) - len(prefix)
            if chunks[-1] and length + rest > max_length:
                chunks.append([])
                length = len(prefix)
            chunks[-1].append(s)
            length += rest
        units += [c[0] if len(c) == 1 else SharedPrompt(len(prefix), tuple(c)) for c in chunks]
    return units


def shareable_prefix(sample: TrainSample) -> int:
    """How many of the sample's first tokens a row may share: those before the last one ahead of its
    first loss token (that one predicts the first loss token, so each sample keeps its own copy)."""
    first_loss = next((i for i, m in enumerate(sample.loss_mask) if m), 0)
    return max(0, first_loss - 1)


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


def collate_packed(rows: Sequence[Sequence[Unit]], pad_id: int, temperature: float) -> PackedBatch:
    """Rows of samples (and shared prompts) as one `PackedBatch`, right-padded to the widest row."""
    width = max(sum(unit_length(u) for u in row) for row in rows)
    shape = (len(rows), width)
    t = _RowTensors(
        ids=torch.full(shape, pad_id, dtype=torch.long),
        positions=torch.zeros(shape, dtype=torch.long),
        sequence=torch.zeros(shape, dtype=torch.long),
        prefix=torch.zeros(shape, dtype=torch.long),
        loss_mask=torch.zeros(shape, dtype=torch.bool),
        old=torch.zeros(shape, dtype=torch.float32),
        advantages=torch.zeros(shape, dtype=torch.float32),
        index=torch.zeros(shape, dtype=torch.long),
    )
    first = 0  # the batch-wide number of the row's first sample
    for r, row in enumerate(rows):
        first = t.fill_row(r, row, first)
    return PackedBatch(
        input_ids=t.ids,
        position_ids=t.positions,
        sequence_ids=t.sequence,
        prefix_ids=t.prefix,
        loss_mask=t.loss_mask[:, 1:],
        old_logprobs=t.old[:, 1:],
        token_advantages=t.advantages[:, 1:],
        sample_index=t.index[:, 1:],
        temperature=temperature,
        num_samples=first,
    )


@dataclass
class _RowTensors:
    """The per-token tensors of a `PackedBatch` being filled, aligned with the inputs."""

    ids: torch.Tensor
    positions: torch.Tensor
    sequence: torch.Tensor
    prefix: torch.Tensor
    loss_mask: torch.Tensor
    old: torch.Tensor
    advantages: torch.Tensor
    index: torch.Tensor

    def fill_row(self, r: int, row: Sequence[Unit], first: int) -> int:
        """Write row `r`'s units, its samples numbered from `first`; returns the next row's `first`."""
        start, segment, sample = 0, 0, first
        for unit in row:
            shared, skip = None, 0
            samples = unit_samples(unit)
            if isinstance(unit, SharedPrompt):  # the shared tokens: no loss, counted with the first sample
                skip = unit.prefix_len
                span = slice(start, start + skip)
                self.ids[r, span] = torch.tensor(samples[0].input_ids[:skip])
                self.positions[r, span] = torch.arange(skip)
                self.sequence[r, span] = self.prefix[r, span] = shared = segment
                self.index[r, span] = sample
                start, segment = start + skip, segment + 1
            for s in samples:
                n = len(s.input_ids) - skip
                span = slice(start, start + n)
                self.ids[r, span] = torch.tensor(s.input_ids[skip:])
                self.positions[r, span] = torch.arange(skip, skip + n)
                self.sequence[r, span] = segment
                self.prefix[r, span] = segment if shared is None else shared
                # A segment's first token is never a target of its own sample.
                self.loss_mask[r, span] = torch.tensor([False, *s.loss_mask[skip + 1 :]])
                if s.old_logprobs is not None:
                    self.old[r, span] = torch.tensor(s.old_logprobs[skip:])
                self.advantages[r, span] = torch.tensor(s.advantages()[skip:])
                self.index[r, span] = sample
                start, segment, sample = start + n, segment + 1, sample + 1
        # The padding is a sequence of its own: a query that may attend to nothing makes sdpa return
        # NaN, which the loss mask would not remove (NaN * 0 is NaN).
        width = self.ids.shape[1]
        self.positions[r, start:] = torch.arange(width - start)
        self.sequence[r, start:] = self.prefix[r, start:] = segment
        self.index[r, start:] = sample - 1
        return sample
