"""The base model and its LoRA adapter (PEFT), shared by the RL and SFT trainers."""

from __future__ import annotations

import json
import resource
import sys
import warnings
from pathlib import Path
from typing import Any, cast

import peft
import torch
from peft.tuners.lora.layer import ParamWrapper
from peft.utils.error import NoMatchingPeftModuleError
from transformers import AutoModelForCausalLM, PreTrainedModel

from lorarl.config.loader import json_object
from lorarl.config.model import LoraConfig, ModelConfig
from lorarl.model_shapes import FUSED_EXPERT_LORA
from lorarl.quantized_base import BASE_NOTE, load_quantized
from lorarl.trainer import attention  # noqa: F401  (registers "packed_sdpa" with transformers)

TrainedModel = PreTrainedModel | peft.PeftModel  # every weight trained, or a LoRA adapter on a frozen base


def load_model(cfg: ModelConfig) -> PreTrainedModel:
    """The base model in model.dtype, or with model.quantization its 4-bit base (quantized_base.py)."""
    if cfg.quantization != "none":
        return cast(PreTrainedModel, load_quantized(cfg))
    model = AutoModelForCausalLM.from_pretrained(
        cfg.name, dtype=getattr(torch, cfg.dtype), attn_implementation=cfg.attn_implementation
    )
    return model


def peft_lora_config(cfg: LoraConfig) -> peft.LoraConfig:
    return peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # annotated int, used as a float: alpha / r
        lora_dropout=cfg.dropout,
        use_rslora=cfg.use_rslora,
        target_modules=cfg.target_modules,
        # PEFT's "not set" is None; an empty list would be saved into adapter_config.json as-is.
        exclude_modules=cfg.exclude_modules or None,
        modules_to_save=cfg.modules_to_save or None,
        task_type="CAUSAL_LM",
    )


def check_lora_for_rl(lora: LoraConfig) -> None:
    """What `rl` needs beyond `check_init_adapter`: vLLM loads LoRA weights only, so an adapter
    with fully trained modules (modules_to_save) could never be sampled from."""
    check_init_adapter(lora)
    saved = _saved_adapter_config(lora).get("modules_to_save") if lora.init_adapter is not None else None
    for where, modules in (
        ("[model.lora] modules_to_save", lora.modules_to_save),
        (f"model.lora.init_adapter {lora.init_adapter}", saved),
    ):
        if modules:
            raise ValueError(
                f"{where} trains {modules} in full, but rl serves every adapter through vLLM, which "
                "loads LoRA weights only: use modules_to_save with sft, and target_modules for rl"
            )


def check_init_adapter(lora: LoraConfig) -> None:
    """An init adapter must match its [model.lora] section: vLLM is started for this rank, and the
    trainer would otherwise silently train another layout than the config says."""
    if lora.init_adapter is None:
        return
    saved = _saved_adapter_config(lora)
    for key, want in (("r", lora.rank), ("lora_alpha", lora.alpha), ("use_rslora", lora.use_rslora)):
        if saved.get(key) != want:
            raise ValueError(
                f"model.lora.init_adapter {lora.init_adapter} has {key}={saved.get(key)}, "
                f"but [model.lora] says {want}: make them agree"
            )


def _saved_adapter_config(lora: LoraConfig) -> dict[str, Any]:
    path = Path(str(lora.init_adapter)) / "adapter_config.json"
    if not path.is_file():
        raise ValueError(f"model.lora.init_adapter: {path} not found (expected a PEFT adapter folder)")
    return json_object(path, "model.lora.init_adapter")


def apply_lora(model: TrainedModel, cfg: LoraConfig, adapter_name: str = "default") -> peft.PeftModel:
    """Wrap `model` with a trainable LoRA adapter named `adapter_name`: fresh (B = 0, so it starts as
    the base model) or loaded from `cfg.init_adapter`. Only adapter weights (and `modules_to_save`)
    require grad. A PeftModel gets the adapter added beside those it has ([[variants]]); the
    caller picks the active one (`set_adapter`)."""
    if cfg.init_adapter is not None:
        check_init_adapter(cfg)
        if isinstance(model, peft.PeftModel):
            model.load_adapter(str(cfg.init_adapter), adapter_name, is_trainable=True)
            return model
        return peft.PeftModel.from_pretrained(model, str(cfg.init_adapter), adapter_name, is_trainable=True)
    linear_names = sorted({n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    try:
        with warnings.catch_warnings():
            # On MoE experts PEFT sets itself the rank_pattern/alpha_pattern of the fused gate_up_proj (2r),
            # then warns that they match no module (they match its parameter): nothing for the user to do.
            warnings.filterwarnings("ignore", r"The following (rank|alpha)_pattern keys did not match", RuntimeWarning)
            # An exclude_modules that leaves nothing out is a mistake PEFT only warns of (two lines, then trains
            # the modules the user meant to exclude): an error, named below.
            warnings.filterwarnings("error", r"You have passed exclude_modules=", UserWarning)
            if isinstance(model, peft.PeftModel):
                model.add_adapter(adapter_name, peft_lora_config(cfg))
                return model
            return peft.get_peft_model(model, peft_lora_config(cfg), adapter_name=adapter_name)
    except NoMatchingPeftModuleError as e:
        excluded = f" (exclude_modules = {cfg.exclude_modules!r})" if cfg.exclude_modules else ""
        raise ValueError(
            f"[model.lora] target_modules = {cfg.target_modules!r}{excluded} adapts no module of the model. "
            "List items are module names (names the model lacks are ignored, but one must exist); a string is "
            "a regular expression matched against whole module paths such as 'model.layers.0.self_attn.q_proj' "
            f"(e.g. '.*\\.q_proj'), or 'all-linear'. Linear modules of this model: {', '.join(linear_names)}. "
            f"PEFT said: {e}"
        ) from None
    except UserWarning:
        raise ValueError(
            f"[model.lora] exclude_modules = {cfg.exclude_modules!r} leaves out none of the modules target_modules "
            f"= {cfg.target_modules!r} adapts. Linear modules of this model: {', '.join(linear_names)}"
        ) from None
    except ValueError as e:
        # e.g. on an MoE model, gate_proj without up_proj (PEFT fuses them into gate_up_proj).
        raise ValueError(f"[model.lora] target_modules = {cfg.target_modules!r}: {e}") from None


def save_adapter(model: peft.PeftModel, folder: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """The model's active adapter alone, as a plain PEFT adapter folder (adapter_config.json and
    adapter_model.safetensors) that vLLM and `PeftModel.from_pretrained` load. PEFT writes an adapter
    not named "default" (a [[variants]] adapter) one folder down, under its name: moved up here."""
    name = model.active_adapter
    model.save_pretrained(str(folder), selected_adapters=[name], state_dict=state_dict)
    note_quantized_base(model, folder)
    if name != "default":
        nested = folder / name
        for entry in nested.iterdir():
            entry.replace(folder / entry.name)
        nested.rmdir()


def note_quantized_base(model: TrainedModel, folder: Path) -> None:
    """Beside an adapter trained on a 4-bit base, BASE_NOTE saying so, for lorarl-merge to tell."""
    quantization = getattr(model.config, "quantization_config", None)
    if quantization is not None:
        note = {"quantization": "nf4", "quant_method": str(getattr(quantization, "quant_method", "bitsandbytes"))}
        (folder / BASE_NOTE).write_text(json.dumps(note) + "\n")


def fused_expert_parameters(model: peft.PeftModel) -> list[str]:
    """The fused 3D expert parameters the model's adapters put LoRA on (e.g. ["down_proj", "gate_up_proj"]).

    On MoE models whose experts transformers 5 stores as fused 3D parameters (Qwen3-MoE and the other
    models PEFT converts from their transformers 4 layout), PEFT turns the expert projections named in
    target_modules into `target_parameters`: one LoRA per expert, gate_up_proj at rank 2r. A router's
    2D weight ("gate.weight", with "all-linear") is a target parameter too, but not an expert's."""
    fused = {n.rpartition(".")[2] for n, p in model.get_base_model().named_parameters() if p.ndim == 3}
    targets = {t for cfg in model.peft_config.values() for t in getattr(cfg, "target_parameters", None) or ()}
    return sorted(targets & fused)


def check_vllm_can_serve(model: peft.PeftModel) -> None:
    """Refuse expert LoRA that vLLM would load wrongly or not at all when the orchestrator hands it over.

    vLLM 0.32 loads PEFT's fused expert layout (with --enable-mixed-moe-lora-format and is_3d_lora_weight
    on each load request, which `rl` sends: docs/moe.md) by module name alone: it takes
    `experts.base_layer` for gate_up_proj and `experts` for down_proj, the nesting PEFT gives both when
    both are targeted (LoRAModelManager._convert_3d_to_2d_moe_lora). One of them alone would be misread
    (gate_up_proj taken for down_proj) or skipped, so the experts get LoRA on both or on neither."""
    for name, module in model.named_modules():
        if name.endswith(".base_layer") or not isinstance(module, ParamWrapper):
            continue  # an inner wrapper: seen through its outer one
        nesting = []
        while isinstance(module, ParamWrapper):
            nesting.append(module.parameter_name)
            module = module.base_layer
        if set(nesting) & set(FUSED_EXPERT_LORA) and nesting != ["down_proj", "gate_up_proj"]:
            raise ValueError(
                f"[model.lora] target_modules puts LoRA on {name}'s {' and '.join(sorted(nesting))} only; vLLM "
                "serves expert LoRA on gate_up_proj and down_proj together: target gate_proj, up_proj and "
                "down_proj, or none of them"
            )


def enable_gradient_checkpointing(model: TrainedModel) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them.

    Non-reentrant checkpointing gives gradients to the LoRA weights inside a layer even though the
    layer's input comes from frozen weights; transformers also makes the embeddings' output require
    grad, which the reentrant variant would need."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The adapter's weights (and any modules_to_save), or every weight of a model trained whole. With
    FSDP these are new objects after sharding (`DataParallel.place`): ask again then."""
    return [p for p in model.parameters() if p.requires_grad]


def parameter_summary(model: torch.nn.Module) -> dict[str, float]:
    trainable = trainable_parameters(model)
    return {
        "params/trainable": sum(p.numel() for p in trainable),
        "params/total": sum(p.numel() for p in model.parameters()),
        "params/trainable_bytes": sum(p.numel() * p.element_size() for p in trainable),
    }


def peak_memory_gib(device: torch.device) -> float:
    """On a GPU: the most memory torch allocated since the last `torch.cuda.reset_peak_memory_stats`.
    On the CPU: the process's peak resident set size so far (it cannot be reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss * (1 if sys.platform == "darwin" else 1024) / 2**30
