"""`[model]` and `[model.lora]`: the base model and the LoRA adapter trained on it, which the trainer
loads and vLLM serves."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from lorarl.config.common import VLLM_LORA_RANKS, Section, UserPath, expand_user


class LoraConfig(Section):
    rank: int = Field(8, ge=1, le=VLLM_LORA_RANKS[-1])
    """LoRA rank r: the inner dimension of each adapted module's two low-rank matrices. At most 512,
    vLLM's largest `--max-lora-rank`; `rl` starts vLLM with the smallest value it accepts that holds r."""
    alpha: float = Field(16.0, gt=0, allow_inf_nan=False)
    """LoRA scaling: the adapter's output is multiplied by alpha / rank (alpha / sqrt(rank) with use_rslora)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability on the input of every LoRA branch while training; 0: no dropout."""
    use_rslora: bool = False
    """Rank-stabilized LoRA: scale by alpha / sqrt(rank) instead of alpha / rank; false: alpha / rank."""
    target_modules: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Modules that get a LoRA adapter, as in PEFT: a list of module names or dotted suffixes (such as
    "self_attn.q_proj"; names the model lacks are ignored), or a string: a regex that must match whole
    module paths such as "model.layers.0.self_attn.q_proj", or "all-linear" (every linear layer but the
    output head). Adapting no module at all is an error. The default, the attention and MLP
    projections, is there because attention-only LoRA underperforms in RL.
    MoE: transformers 5 stores experts as fused 3D parameters, not linear layers; on Qwen3-MoE (and
    the other MoE models PEFT converts from their transformers 4 layout) PEFT maps gate_proj + up_proj
    onto mlp.experts.gate_up_proj at rank 2r and down_proj onto mlp.experts.down_proj, one LoRA per
    expert; the router (mlp.gate) stays frozen unless targeted ("all-linear" adds it). `sft` and `rl`
    train them; `rl` serves them through vLLM in that fused layout (--enable-mixed-moe-lora-format,
    --max-lora-rank 2r, is_3d_lora_weight on each load), which needs a GPU build of vLLM: on the CPU it
    refuses expert LoRA before anything starts. `rl` needs gate_proj, up_proj and down_proj targeted
    together or not at all (vLLM reads one alone wrongly; docs/moe.md)."""
    exclude_modules: list[str] | str = []
    """Modules left out of target_modules, in the same form: a list of module names or dotted suffixes,
    or a regex string; []: none left out. One that leaves out no targeted module is refused."""
    modules_to_save: list[str] = []
    """Modules trained in full and saved with the adapter, matched as path suffixes (e.g. ["lm_head"]);
    []: none. `sft` only: `rl` refuses them, also in an init_adapter, because vLLM serves LoRA weights only."""
    init_adapter: UserPath | None = None
    """A PEFT adapter folder to start from (e.g. an `sft` result); its rank, alpha and use_rslora must
    match this section. None: a fresh adapter, whose B = 0 makes it exactly the base model."""

    @field_validator("target_modules", "exclude_modules", mode="after")
    @classmethod
    def _names_or_regex(cls, value: list[str] | str) -> list[str] | str:
        # The command line hands every value of a list-or-string key over as a list, so a one-item list
        # that cannot be a module name is the regex (or "all-linear") the user wrote.
        if isinstance(value, list) and len(value) == 1 and not cls._is_module_name(value[0]):
            value = value[0]
        if isinstance(value, str):
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"{value!r} is not a valid regular expression: {e}") from None
            return value
        if bad := [v for v in value if not cls._is_module_name(v)]:
            # PEFT compares list items with module names literally, so these could never match.
            raise ValueError(
                f"list items are module names such as 'q_proj', not patterns: {bad}; "
                "give a single string for a regular expression"
            )
        return value

    @staticmethod
    def _is_module_name(name: str) -> bool:
        """A module name or dotted path ("q_proj", "self_attn.q_proj"), not a regular expression."""
        return all(part and all(c.isalnum() or c == "_" for c in part) for part in name.split("."))


class ModelConfig(Section):
    name: Annotated[str, AfterValidator(expand_user)]
    """The base model: a Hugging Face model folder (or a hub id where a hub is reachable), which the
    trainer and vLLM load."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The dtype the trainer loads the weights in, and vLLM's `--dtype`: "float32", "bfloat16" or "float16"."""
    attn_implementation: Literal[
        "packed_sdpa", "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"
    ] = "packed_sdpa"
    """The trainer's transformers attention implementation (vLLM picks its own). "packed_sdpa": lorarl's,
    sdpa on each packed sample (and shared prompt) on its own, so attention costs what the samples do, not
    the square of the row (docs/attention.md); plain sdpa for unpacked rows and for rows of at most 256
    tokens, where one call with a dense mask costs less. "flex_attention": a
    FlexAttention block mask (trains on GPUs only). "sdpa", "eager": a dense block-diagonal mask per
    packed row. "flash_attention_2", "flash_attention_3" (where installed): boundaries from position ids,
    no shared prompts."""
    quantization: Literal["none", "nf4"] = "none"
    """The frozen base's storage on the trainer (QLoRA, docs/qlora.md). "nf4": bitsandbytes' 4-bit NormalFloat
    with double-quantized scales for every linear layer, the embeddings and the output head (about a quarter
    of the bytes), dequantized to `dtype` on the fly; the LoRA adapter stays in `dtype`. vLLM serves the same
    weights: the base as the trainer sees it (quantized, then dequantized to `dtype`) is written once into
    the run folder (served_base/) and served from there. Needs a LoRA adapter (not full_finetune) and no
    trainer.parallel.fsdp; `lorarl-merge` merges such an adapter into the full-precision base. "none": the
    base as stored, in `dtype`."""
    lora: LoraConfig | None = None
    """The LoRA adapter to train. `rl` trains one (absent: the defaults below) unless full_finetune is set;
    absent in an `sft` config means full fine-tuning of every weight."""
    full_finetune: bool = False
    """Train every weight of the model, with no LoRA adapter (leave out [model.lora]). In `rl` every
    policy version is then a whole model that each vLLM worker reloads in place (vLLM's reload_weights),
    replacing the last one: requests in flight (an eval's too) finish on the new weights, so its
    workers serve this run alone (no [[variants]]). In `sft` the same as leaving out [model.lora].
    false: LoRA."""

    @model_validator(mode="after")
    def _lora_or_full(self) -> ModelConfig:
        if self.full_finetune and self.lora is not None:
            raise ValueError("model.full_finetune trains every weight, so [model.lora] has no adapter to set: drop one")
        if self.full_finetune and self.quantization != "none":
            raise ValueError(
                f"model.quantization = {self.quantization!r} freezes the base in 4 bits, so model.full_finetune "
                "has no weight to train in it: train a LoRA adapter on it, or leave quantization at 'none'"
            )
        return self


def check_quantized_base(model: ModelConfig, fsdp: bool, fsdp_key: str) -> None:
    """A quantized base is kept whole on one device: bitsandbytes' 4-bit weights are not sharded here."""
    if model.quantization != "none" and fsdp:
        raise ValueError(
            f"model.quantization = {model.quantization!r} keeps the base in 4-bit weights that lorarl does not shard: "
            f"set {fsdp_key} = false (the base is about a quarter of its size), or model.quantization = 'none'"
        )
