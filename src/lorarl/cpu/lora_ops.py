"""LoRA on vLLM-CPU at a cost that follows the batch, not `--max-lora-rank`: a worker extension.

vLLM 0.32's CPU LoRA ops (`vllm.lora.ops.torch_ops`, used by `PunicaWrapperCPU`) copy, for every
token of a batch, its adapter's A or B matrix padded to --max-lora-rank (`weights[indices]`: tokens ×
max rank × width floats) and multiply token by token, so a batch's LoRA cost follows the server's
--max-lora-rank, whatever the adapter's own rank: a sweep's rank-1 variant samples at the speed of its
rank-64 sibling (docs/rank_sweep.md). Here each adapter slot in the batch multiplies its rows with one
matmul; with no copy, the padding to --max-lora-rank costs little.

vLLM imports this module in every worker process (`--worker-extension-cls`, which `rl` passes to a
CPU server that serves adapters: server.py) before it builds the model; on GPUs nothing is patched
(their ops are Triton kernels). Rows of index -1 (a request for the base model) get no adapter, as
vLLM's GPU kernels do: vLLM's CPU ops take index -1 for the last adapter slot. On a CPU the
extension also makes the worker stop spinning once idle (worker_idle.py), for the trainer's sake.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.lora.ops.torch_ops import lora_ops
from vllm.lora.punica_wrapper import punica_cpu
from vllm.platforms import current_platform

from lorarl.cpu import worker_idle


def lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row i of `inputs` times adapter slot `indices[i]`'s matrix of `weights` ([slots, (1,) out, in]),
    transposed, in `dtype`: one matmul per slot in the batch; zeros for rows of index -1."""
    stacked = weights.squeeze(1) if weights.dim() == 4 else weights
    inputs = inputs.to(dtype)
    slots = torch.unique(indices).tolist()
    if len(slots) == 1 and slots[0] >= 0:  # one adapter for the whole batch: no row selection
        return inputs @ stacked[slots[0]].to(dtype).T
    out = torch.zeros(inputs.shape[0], stacked.shape[1], dtype=dtype, device=inputs.device)
    for slot in slots:
        if slot >= 0:
            rows = (indices == slot).nonzero().squeeze(1)
            out[rows] = inputs[rows] @ stacked[slot].to(dtype).T
    return out


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's `bgmv_shrink` (output = scaling · x @ A.T), adapter by adapter."""
    outputs = lora_matmul(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """vLLM's `bgmv_expand` (output (+)= x @ B.T over the width both have), adapter by adapter."""
    outputs = lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad the width differently
    # As vLLM's: rows past the output's are dropped, and a single row goes to every row of it.
    _store(output_tensor[:, :common], outputs[: output_tensor.shape[0], :common], add_inputs)


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's `bgmv_expand_slice` (columns slice_offset.. of output (+)= x @ B.T), adapter by adapter."""
    outputs = lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    _store(output_tensor[:, slice_offset : slice_offset + slice_size], outputs, add_inputs)


def _store(target: torch.Tensor, values: torch.Tensor, add: bool) -> None:
    """Add `values` to the view `target` of an output, or write them there."""
    if add:
        target += values
    else:
        target.copy_(values)


_add_lora_logits = punica_cpu.PunicaWrapperCPU.add_lora_logits


def add_lora_logits(
    self: punica_cpu.PunicaWrapperCPU, y: torch.Tensor, x: torch.Tensor, *args: Any, **kwargs: Any
) -> None:
    """vLLM's, except for the logits of a request's prompt tokens (prompt_logprobs, which the
    served-adapter check asks for): vLLM's CPU path maps those rows with the sampled rows' adapter
    indices, which do not match them (an IndexError that kills the engine once a batch mixes
    adapters), so they get no LM-head LoRA, as on GPUs (vllm#51594). lorarl's adapters leave the LM
    head alone."""
    if x.view(-1, x.shape[-1]).shape[0] != self.sampler_indices.shape[0]:
        return
    _add_lora_logits(self, y, x, *args, **kwargs)


def install() -> None:
    """Put these ops where vLLM's CPU LoRA looks them up at each call: the decode path and the logits
    (punica_cpu's names) and, through lora_ops' own names, the prefill path (its sgmv_* call bgmv_*)."""
    for module in (lora_ops, punica_cpu):
        for op in (bgmv_shrink, bgmv_expand, bgmv_expand_slice):
            setattr(module, op.__name__, op)
    punica_cpu.PunicaWrapperCPU.add_lora_logits = add_lora_logits  # type: ignore[method-assign]


if current_platform.is_cpu():
    install()
    worker_idle.install()


class CpuLoRA:
    """The class `--worker-extension-cls` names: importing its module is the whole extension."""
