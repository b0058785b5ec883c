"""A frozen base stored in 4 bits (QLoRA, `model.quantization = "nf4"`): how the trainer loads it, and
the copy of it that vLLM serves.

The trainer loads the base through transformers' BitsAndBytesConfig (bitsandbytes' NF4, double-quantized
scales, on the CPU whatever the device: the quantized bytes are then the same everywhere), and quantizes
the embeddings and the output head too: at Qwen3-0.6B's shape they are a quarter of the weights, and
left in full precision they would keep the base above a third of its size. Each 4-bit layer computes
with its weight dequantized to model.dtype.

vLLM must sample from those same weights, or every importance ratio carries the quantization error. A
CPU build of vLLM has no bitsandbytes, and a GPU build's own NF4 path was not shown to reproduce these
bytes, so lorarl writes once the base as the trainer sees it (each 4-bit weight dequantized to
model.dtype, exactly what the layer multiplies with) into the run folder's served_base/, a folder
written whole and recorded (written_files.py), and serves that.

PEFT's prepare_model_for_kbit_training is not called: besides what lorarl does anyway (a frozen base,
non-reentrant gradient checkpointing), it casts every bfloat16 weight left unquantized to float32, which
would make the trainer compute in float32 while vLLM computes in model.dtype.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, cast

import torch

from lorarl.config.model import ModelConfig
from lorarl.cpu.host_memory import release_freed_memory
from lorarl.inference.server import SERVED_BASE

BLOCKSIZE = 64  # elements per NF4 scale, bitsandbytes' default
# Beside an adapter trained on a quantized base: which quantization (lorarl-merge says so).
BASE_NOTE = "lorarl-base.json"


def bitsandbytes_problem(device: torch.device) -> str | None:
    """Why bitsandbytes cannot quantize to NF4 and back on `device`, in a few words; None when it can
    (tried on a small tensor)."""
    try:
        import bitsandbytes.functional as bnbf
    except Exception as e:  # ImportError, or a library that fails to load
        return f"bitsandbytes cannot be imported ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    try:
        packed, state = bnbf.quantize_4bit(torch.ones(BLOCKSIZE, device=device), blocksize=BLOCKSIZE, quant_type="nf4")
        bnbf.dequantize_4bit(packed, state)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"bitsandbytes cannot quantize on {device.type} here ({first})"
    return None


def check_quantization(cfg: ModelConfig, device: torch.device) -> None:
    """ValueError naming model.quantization when it is set and bitsandbytes cannot do it on `device`."""
    if cfg.quantization != "none" and (problem := bitsandbytes_problem(device)):
        raise ValueError(f"model.quantization = {cfg.quantization!r}: {problem}; set model.quantization = 'none'")


def load_quantized(cfg: ModelConfig) -> Any:
    """The base model, every linear layer, the embeddings and the output head in NF4 (on the CPU)."""
    from bitsandbytes.nn import Linear4bit
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    check_quantization(cfg, torch.device("cpu"))
    dtype = getattr(torch, cfg.dtype)
    config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_quant_storage=torch.uint8,
    )
    model = AutoModelForCausalLM.from_pretrained(
        cfg.name,
        dtype=dtype,
        attn_implementation=cfg.attn_implementation,
        quantization_config=config,
        device_map="cpu",
    )
    _quantize_embeddings(model, dtype)
    for module in model.modules():
        if isinstance(module, Linear4bit):
            # On CPUs with AVX512-bf16, bitsandbytes 0.50 repacks a layer's weight in place the first time it
            # runs in eval mode without grad, and then computes in bfloat16: another result, and a layout
            # the embeddings sharing the output head's weight cannot read.
            module.support_avx512bf16_for_cpu = False
    _own_unquantized(model)
    # The full-precision weights, read and quantized, are free now: 0.3 GiB resident at Qwen3-0.6B's
    # shape instead of 1.2 (docs/qlora.md).
    release_freed_memory()
    return model


def _own_unquantized(model: Any) -> None:
    """Copy the weights left in full precision (the norms) into memory of their own. Loaded in the
    dtype they are stored in, they are views of the mapped checkpoint file, which keeps every page
    read while quantizing resident: 2.2 GiB of a float32 Qwen3-0.6B-shaped base for a quarter of a MiB of norms."""
    from bitsandbytes.nn import Params4bit

    for param in model.parameters():
        if not isinstance(param, Params4bit):
            param.data = param.data.clone()


def _quantize_embeddings(model: Any, dtype: torch.dtype) -> None:
    """Put the input embeddings, and the output head (the same 4-bit weight when tied), in NF4."""
    from bitsandbytes.nn import Linear4bit

    embeddings = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embeddings.weight
    # Scales per block of 64 within each row (no double quantization): the embedding looks rows up
    # with their scales alone.
    weight = _params4bit(embeddings.weight, compress_statistics=False)
    quantized = _Embedding4bit(embeddings.num_embeddings, embeddings.embedding_dim, dtype=dtype, device="meta")
    quantized.weight = weight
    weight.module = quantized
    model.set_input_embeddings(quantized)
    if head is None:
        return
    out = Linear4bit(
        head.in_features, head.out_features, bias=False, compute_dtype=dtype, quant_type="nf4", device="meta"
    )
    head_weight = weight if tied else _params4bit(cast(torch.Tensor, head.weight), compress_statistics=True)
    out.weight = head_weight
    out.quant_state = head_weight.quant_state
    model.set_output_embeddings(out)


def _params4bit(weight: torch.Tensor, compress_statistics: bool) -> Any:
    import bitsandbytes.functional as bnbf
    from bitsandbytes.nn import Params4bit

    packed, state = bnbf.quantize_4bit(
        weight.data.contiguous(), blocksize=BLOCKSIZE, compress_statistics=compress_statistics, quant_type="nf4"
    )
    return Params4bit(
        packed,
        requires_grad=False,
        quant_state=state,
        blocksize=BLOCKSIZE,
        compress_statistics=compress_statistics,
        quant_type="nf4",
        bnb_quantized=True,
    )


def _embedding4bit_class() -> type:
    from bitsandbytes.nn import Embedding4bit

    class Embedding4bitSaved(Embedding4bit):
        """bitsandbytes' 4-bit embedding, whose state dict holds its packed weight and scales (as
        Linear4bit's does) instead of raising: PEFT reads the whole model's state dict to save an adapter."""

        def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
            torch.nn.Module._save_to_state_dict(self, destination, prefix, keep_vars)
            for key, value in cast(Any, self.weight).quant_state.as_dict(packed=True).items():
                destination[prefix + "weight." + key] = value if keep_vars else value.detach()

    return Embedding4bitSaved


def _Embedding4bit(*args: Any, **kwargs: Any) -> Any:  # noqa: N802  (a class, built where bitsandbytes loads)
    return _embedding4bit_class()(*args, quant_type="nf4", **kwargs)


def effective_weight(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight a layer computes with: a 4-bit one dequantized to `dtype`, any other as it is."""
    state = getattr(param, "quant_state", None)
    if state is None:
        return param.detach().to(dtype)
    import bitsandbytes.functional as bnbf

    return bnbf.dequantize_4bit(param.data, state).to(dtype)


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of every weight and 4-bit scale `model` holds (a tied weight once): what the base costs,
    quantized or not (the measure of docs/qlora.md and its benchmark)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
        state = getattr(p, "quant_state", None)
        if state is not None:
            extra = (state.state2.absmax, state.offset) if state.nested else ()
            total += sum(t.numel() * t.element_size() for t in (state.absmax, *extra))
    return total


def served_state_dict(model: Any, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every weight of `model` (a tied one once) as the trainer computes with it, in `dtype`."""
    return {name: effective_weight(p, dtype).cpu().contiguous() for name, p in model.named_parameters()}


def write_served_base(cfg: ModelConfig, folder: Path) -> None:
    """Write into `folder` the base as the trainer sees it, a model folder vLLM loads (config and
    generation config copied from the base; the tokenizer is the base's, given to vLLM apart)."""
    from huggingface_hub import save_torch_state_dict

    model = load_quantized(cfg)
    save_torch_state_dict(served_state_dict(model, getattr(torch, cfg.dtype)), str(folder))
    source = Path(cfg.name)
    for name in ("config.json", "generation_config.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)


def ensure_served_base(cfg: ModelConfig, run_root: Path) -> Path:
    """The run folder's served_base/, written now unless a whole one is there (a resumed run's)."""
    from lorarl.run_folder import write_folder_atomically
    from lorarl.written_files import manifest_problem

    folder = run_root / SERVED_BASE
    if manifest_problem(folder, checksums=False) is not None:
        write_folder_atomically(folder, lambda tmp: write_served_base(cfg, tmp))
    return folder
