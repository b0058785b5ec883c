"""Attention over packed rows at the cost of their samples, not of the row (see packing.py).

A packed row holds several samples (and shared prompts); each token may attend only to its own
segment's earlier tokens and to its shared prompt. Given as a dense [R, 1, L, L] mask to sdpa, that
costs memory and time in the square of the row width L, whatever the samples. Two paths instead
compute only what the samples see:

* "packed_sdpa" (`PACKED_SDPA`, registered here as a transformers attention implementation): each
  segment's attention is one sdpa call on its own tokens (`Segments`, a keyword argument of the
  forward pass that transformers hands to the attention function). A segment without a shared prompt
  is plain causal attention (`is_causal`: no mask, and PyTorch's flash kernels on CPU and GPU). A
  segment with one also attends to the whole prompt: where the prompt is the shorter, its queries
  are computed again with the segment's, causal over [prompt; segment], and their outputs dropped
  (exact: dropped outputs pass back zero gradient); otherwise the segment's queries get an additive
  [segment, prompt + segment] mask, made once per forward pass and shared by the layers. Padded
  (unpacked) rows get transformers' sdpa unchanged. Works on every device.
* "flex_attention" (transformers' own): a `BlockMask` from the same segment ids
  (`flex_block_mask`), with which FlexAttention skips the blocks of the row that no token of a block
  sees. torch 2.13 has no FlexAttention backward on the CPU, so it trains on GPUs only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_SDPA = "packed_sdpa"
SEGMENTS_KWARG = "packed_segments"


@dataclass(frozen=True)
class Segment:
    """A sample (or a shared prompt, or the padding) of a packed row: tokens `start` to `end` of row
    `row`, attending causally to themselves and wholly to the shared prompt `prompt_start` to
    `prompt_end` before them (an empty span: none)."""

    row: int
    start: int
    end: int
    prompt_start: int = 0
    prompt_end: int = 0

    @property
    def prompt_len(self) -> int:
        return self.prompt_end - self.prompt_start


@dataclass
class Segments:
    """The segments of every row of a packed batch, in row order; each row's cover it end to end."""

    rows: list[list[Segment]]
    # Additive masks of segments with a prompt, by (segment, dtype, device): made by the first layer,
    # shared by the others.
    _masks: dict[tuple[Segment, torch.dtype, torch.device], torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, sequence_ids: torch.Tensor, prefix_ids: torch.Tensor) -> Segments:
        """From a packed batch's `sequence_ids` and `prefix_ids` ([R, L], see `PackedBatch`)."""
        rows = zip(sequence_ids, prefix_ids, strict=True)
        return cls([_row_segments(r, seq, prefix) for r, (seq, prefix) in enumerate(rows)])

    @property
    def mask_bytes(self) -> int:
        """What the masks made so far take."""
        return sum(m.numel() * m.element_size() for m in self._masks.values())

    def mask(self, segment: Segment, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The additive [n, prompt + n] mask of a segment of n tokens with a shared prompt: the whole
        prompt, and its own tokens causally."""
        key = (segment, dtype, device)
        if key not in self._masks:
            n, m = segment.end - segment.start, segment.prompt_len
            allowed = torch.ones(n, m + n, dtype=torch.bool, device=device).tril(m)
            self._masks[key] = torch.zeros(n, m + n, dtype=dtype, device=device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )
        return self._masks[key]


def _row_segments(row: int, sequence_ids: torch.Tensor, prefix_ids: torch.Tensor) -> list[Segment]:
    """One row's segments: runs of equal sequence ids, each with the span of the segment its prefix id names."""
    numbers, counts = torch.unique_consecutive(sequence_ids, return_counts=True)
    ends = counts.cumsum(0).tolist()
    spans = dict(zip(numbers.tolist(), zip([0, *ends[:-1]], ends, strict=True), strict=True))
    segments = []
    for number, (start, end) in spans.items():
        prompt = int(prefix_ids[start])
        if prompt == number:
            segments.append(Segment(row, start, end))
            continue
        prompt_start, prompt_end = spans[prompt]
        if prompt_end > start:
            raise ValueError(f"row {row}: the shared prompt of tokens {start}-{end} does not precede them")
        segments.append(Segment(row, start, end, prompt_start, prompt_end))
    return segments


def packed_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_segments: Segments | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention function for `PACKED_SDPA`: q/k/v [B, heads, L, head_dim] in,
    [B, L, heads, head_dim] out. Without `packed_segments`, transformers' sdpa."""
    if packed_segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{PACKED_SDPA} does not implement sliding-window attention: use sdpa or flex_attention")

    def attend(segment: Segment) -> torch.Tensor:
        return _segment_attention(module, (query, key, value), segment, packed_segments, dropout, scaling)

    rows = [torch.cat([attend(s) for s in segments], dim=1) for segments in packed_segments.rows]
    return torch.cat(rows), None


def _segment_attention(
    module: torch.nn.Module,
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    segment: Segment,
    segments: Segments,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """One segment's attention output [1, n, heads, head_dim] (module docstring)."""
    own = slice(segment.start, segment.end)
    prompt = slice(segment.prompt_start, segment.prompt_end)
    q, k, v = (t[segment.row : segment.row + 1] for t in qkv)
    if not segment.prompt_len:
        return _sdpa(module, q[:, :, own], k[:, :, own], v[:, :, own], None, dropout, scaling)
    keys, values = (torch.cat([t[:, :, prompt], t[:, :, own]], dim=2) for t in (k, v))
    if segment.prompt_len < segment.end - segment.start:
        queries = torch.cat([q[:, :, prompt], q[:, :, own]], dim=2)
        return _sdpa(module, queries, keys, values, None, dropout, scaling)[:, segment.prompt_len :]
    mask = segments.mask(segment, q.dtype, q.device)
    return _sdpa(module, q[:, :, own], keys, values, mask, dropout, scaling)


def _sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """transformers' sdpa call (grouped-query heads, causal without a mask) on one segment."""
    return sdpa_attention_forward(module, query, key, value, mask, dropout, scaling, is_causal=True)[0]


def _padding_mask(**kwargs: Any) -> torch.Tensor | None:
    """The mask transformers makes for `PACKED_SDPA`: sdpa's for padded rows; none for packed rows,
    which the segments describe (sdpa's would be the dense mask this path avoids)."""
    return None if kwargs.get("attention_mask") is None else sdpa_mask(**kwargs)


def flex_block_mask(sequence_ids: torch.Tensor, prefix_ids: torch.Tensor) -> BlockMask:
    """FlexAttention's block mask for a packed batch: a token attends to the earlier tokens of its own
    segment and of its shared prompt (`PackedBatch`)."""
    rows, length = sequence_ids.shape

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        seen = (sequence_ids[b, q] == sequence_ids[b, kv]) | (prefix_ids[b, q] == sequence_ids[b, kv])
        return seen & (q >= kv)

    return _compiled_block_mask(mask_mod, rows, None, length, length, device=sequence_ids.device)


# Compiled (as transformers does for its own block masks), create_block_mask works block by block;
# eager, it would first make the whole [R, L, L] mask that this path avoids.
_compiled_block_mask = torch.compile(create_block_mask)


AttentionInterface.register(PACKED_SDPA, packed_sdpa_forward)
AttentionMaskInterface.register(PACKED_SDPA, _padding_mask)
