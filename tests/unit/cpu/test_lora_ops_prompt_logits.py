"""The LM head's LoRA on vLLM-CPU (cpu/lora_ops.py): the logits of sampled rows get it as
vLLM's do; the logits of a request's prompt tokens (prompt_logprobs, the served-adapter check's
probe), which vLLM maps with the sampled rows' indices, are left alone instead of crashing the engine
(an IndexError once a batch mixed adapters)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import torch
from vllm.lora.punica_wrapper import punica_cpu

from lorarl.cpu import lora_ops

SLOTS, RANK, WIDTH, VOCAB = 2, 4, 8, 16


def logits_lora(rows: int, sampler_indices: list[int]) -> torch.Tensor:
    """What add_lora_logits adds to `rows` rows of zero logits, given the sampled rows' indices."""
    torch.manual_seed(0)
    wrapper = cast(Any, SimpleNamespace(sampler_indices=torch.tensor(sampler_indices)))
    y, x = torch.zeros(rows, VOCAB), torch.randn(rows, WIDTH)
    a, b = torch.randn(SLOTS, 1, RANK, WIDTH), torch.randn(SLOTS, 1, VOCAB, RANK)
    punica_cpu.PunicaWrapperCPU.add_lora_logits(wrapper, y, x, a, b, 1.0)
    return y


def test_sampled_rows_get_their_adapters_lm_head_lora() -> None:
    assert punica_cpu.PunicaWrapperCPU.add_lora_logits is lora_ops.add_lora_logits  # installed on import
    added = logits_lora(3, [0, 1, 1])
    assert added.abs().sum(dim=1).gt(0).all()  # every row got its adapter's LM-head LoRA


def test_prompt_rows_of_a_mixed_batch_get_none_instead_of_crashing() -> None:
    # 5 prompt rows of one request, scored while 3 sampled rows of two adapters are in the batch.
    assert torch.equal(logits_lora(5, [0, 1, 1]), torch.zeros(5, VOCAB))
    assert torch.equal(logits_lora(2, [0, 1, 1]), torch.zeros(2, VOCAB))
