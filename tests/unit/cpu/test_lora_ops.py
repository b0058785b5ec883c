"""lorarl's CPU LoRA ops give what vLLM's own CPU ops give, for batches of one adapter or several, in
the decode (bgmv) and prefill (sgmv) paths, and are what vLLM's CPU LoRA calls once imported."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest
import torch
from vllm.lora.ops.torch_ops import lora_ops
from vllm.lora.punica_wrapper import punica_cpu

from lorarl.cpu import lora_ops as cpu_lora

SLOTS, RANK, WIDTH, OUT = 4, 16, 48, 40


def fresh_copy(name: str) -> ModuleType:
    """A copy of module `name` imported afresh, beside the loaded one."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stock() -> ModuleType:
    """vLLM's CPU LoRA ops as vLLM ships them (importing cpu_lora patched the loaded module)."""
    return fresh_copy("vllm.lora.ops.torch_ops.lora_ops")


def batch(
    indices: list[int], dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of each row, adapter slots' A ([slots, 1, rank, width]) and B ([slots, 1, out, rank]), the
    rows' slots. The last slot is empty (zeros, as vLLM keeps a free slot), so that vLLM's ops, which
    read index -1 (a row for the base model) as the last slot, give such rows no adapter either."""
    g = torch.Generator().manual_seed(len(indices))
    x = torch.randn(len(indices), WIDTH, generator=g).to(dtype)
    a = torch.randn(SLOTS, 1, RANK, WIDTH, generator=g).to(dtype)
    b = torch.randn(SLOTS, 1, OUT, RANK, generator=g).to(dtype)
    a[-1], b[-1] = 0, 0
    return x, a, b, torch.tensor(indices)


def same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Equal up to rounding: a matmul and vLLM's einsum add a row's products in different orders
    (outputs here are of magnitude ~50, so float32 rounding reaches 1e-5)."""
    tol = {} if ours.dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-4}
    torch.testing.assert_close(ours, theirs, **tol)


MIXED = [2, 0, 0, -1, 1, 2, 2, -1, 0]


@pytest.mark.parametrize(
    ("indices", "dtype"),
    [(MIXED, torch.float32), (MIXED, torch.bfloat16), ([1] * 6, torch.float32), ([-1] * 3, torch.float32)],
)
def test_decode_ops_match_vllms(stock: ModuleType, indices: list[int], dtype: torch.dtype) -> None:
    x, a, b, idx = batch(indices, dtype)
    ours, theirs = torch.zeros(len(indices), RANK, dtype=dtype), torch.zeros(len(indices), RANK, dtype=dtype)
    cpu_lora.bgmv_shrink(x, a, ours, idx, 0.5)
    stock.bgmv_shrink(x, a, theirs, idx, 0.5)
    same(ours, theirs)
    for add in (True, False):
        y_ours, y_theirs = torch.ones(len(indices), OUT, dtype=dtype), torch.ones(len(indices), OUT, dtype=dtype)
        cpu_lora.bgmv_expand(ours, b, y_ours, idx, add)
        stock.bgmv_expand(theirs, b, y_theirs, idx, add)
        same(y_ours, y_theirs)
        # Two slices of B side by side in one output, as for q, k, v.
        y_ours, y_theirs = (
            torch.ones(len(indices), 2 * OUT, dtype=dtype),
            torch.ones(len(indices), 2 * OUT, dtype=dtype),
        )
        cpu_lora.bgmv_expand_slice(ours, b, y_ours, idx, OUT, OUT, add)
        stock.bgmv_expand_slice(theirs, b, y_theirs, idx, OUT, OUT, add)
        same(y_ours, y_theirs)


@pytest.mark.parametrize("rows", [1, 5])
def test_expand_fits_its_rows_to_the_outputs_as_vllms_does(stock: ModuleType, rows: int) -> None:
    _, _, b, idx = batch(MIXED[:rows])
    shrunk = torch.randn(rows, RANK, generator=torch.Generator().manual_seed(0))
    y_ours, y_theirs = torch.ones(3, OUT), torch.ones(3, OUT)
    cpu_lora.bgmv_expand(shrunk, b, y_ours, idx, True)
    stock.bgmv_expand(shrunk, b, y_theirs, idx, True)
    same(y_ours, y_theirs)


def test_prefill_ops_use_them_and_match_vllms(stock: ModuleType) -> None:
    # Requests of 3, 4 and 1 tokens, consecutive ones grouped by adapter as vLLM does; the last for the base model.
    x, a, b, _ = batch([0] * 8)
    starts, lengths, slots = torch.tensor([0, 3, 7]), torch.tensor([3, 4, 1]), torch.tensor([2, 0, -1])
    meta = (starts, lengths, slots, 3, 4, 8)
    ours, theirs = torch.zeros(8, RANK), torch.zeros(8, RANK)
    lora_ops.sgmv_shrink(x, a, ours, *meta, 2.0)
    stock.sgmv_shrink(x, a, theirs, *meta, 2.0)
    same(ours, theirs)
    y_ours, y_theirs = torch.ones(8, OUT), torch.ones(8, OUT)
    lora_ops.sgmv_expand(ours, b, y_ours, *meta, True)
    stock.sgmv_expand(theirs, b, y_theirs, *meta, True)
    same(y_ours, y_theirs)
    y_ours, y_theirs = torch.ones(8, 2 * OUT), torch.ones(8, 2 * OUT)
    lora_ops.sgmv_expand_slice(ours, b, y_ours, *meta, 0, OUT, False)
    stock.sgmv_expand_slice(theirs, b, y_theirs, *meta, 0, OUT, False)
    same(y_ours, y_theirs)


def test_rows_without_an_adapter_get_none_when_every_slot_holds_one() -> None:
    # vLLM's CPU ops would give these rows the last slot's adapter; its GPU kernels give them none.
    x, a, b, idx = batch([1, -1, 1, -1])
    a[-1], b[-1] = 1, 1
    buffer = torch.full((4, RANK), 7.0)
    cpu_lora.bgmv_shrink(x, a, buffer, idx, 1.0)
    assert buffer[[1, 3]].eq(0).all() and buffer[[0, 2]].ne(0).all()
    y = torch.ones(4, OUT)
    cpu_lora.bgmv_expand(buffer, b, y, idx, True)
    assert y[[1, 3]].eq(1).all() and y[[0, 2]].ne(1).any()


def test_importing_the_extension_replaces_vllms_cpu_ops() -> None:
    for module in (lora_ops, punica_cpu):
        assert module.bgmv_shrink is cpu_lora.bgmv_shrink
        assert module.bgmv_expand is cpu_lora.bgmv_expand
        assert module.bgmv_expand_slice is cpu_lora.bgmv_expand_slice


def test_on_another_platform_importing_it_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    fresh = fresh_copy("lorarl.cpu.lora_ops")
    for module in (lora_ops, punica_cpu):
        assert module.bgmv_shrink is not fresh.bgmv_shrink and module.bgmv_shrink is cpu_lora.bgmv_shrink
