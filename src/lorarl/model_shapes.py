"""The published shapes of the hub models lorarl's recipes train, without the hub.

No model hub is reachable where lorarl is developed (and a dry run should not need one), yet the
memory plan of a `configs/gpu/` recipe and the real-shape benchmarks need these models' exact
configs. This table holds the values of each model's config.json as published (the keys that fix
its shape and its tokens); `hub_config` returns them, `transformers_config` builds the transformers
config from them, with which a model can be built with random weights (or on the meta device).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# The fused MoE expert parameters PEFT puts LoRA on (transformers 5's layout: Qwen3-MoE and kin) and
# vLLM loads in that layout: the experts' gate and up projections as one tensor, and down_proj.
FUSED_EXPERT_LORA = ("gate_up_proj", "down_proj")

_QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "head_dim": 128,
    "num_key_value_heads": 8,
    "vocab_size": 151936,
    "hidden_act": "silu",
    "attention_bias": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "max_position_embeddings": 40960,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, tied: bool, **more: Any) -> dict[str, Any]:
    return {
        **_QWEN3_COMMON,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "max_window_layers": layers,
        "tie_word_embeddings": tied,
        **more,
    }


_QWEN3_4B_2507 = _qwen3(2560, 9728, 36, 32, True, max_position_embeddings=262144, rope_theta=5000000)

# config.json of each model as published on the Hugging Face hub (the keys that fix its shape).
HUB_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-0.6B": _qwen3(1024, 3072, 28, 16, True),
    "Qwen/Qwen3-1.7B": _qwen3(2048, 6144, 28, 16, True),
    "Qwen/Qwen3-4B": _qwen3(2560, 9728, 36, 32, True),
    "Qwen/Qwen3-8B": _qwen3(4096, 12288, 36, 32, False),
    "Qwen/Qwen3-14B": _qwen3(5120, 17408, 40, 40, False),
    "Qwen/Qwen3-32B": _qwen3(5120, 25600, 64, 64, False),
    "Qwen/Qwen3-4B-Instruct-2507": _QWEN3_4B_2507,
    "Qwen/Qwen3-4B-Thinking-2507": _QWEN3_4B_2507,
    # 128 experts of width 768 in each of its 48 layers, 8 of them per token: 30.5B parameters, 3.3B active.
    "Qwen/Qwen3-30B-A3B": _qwen3(
        2048,
        6144,
        48,
        32,
        False,
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        num_key_value_heads=4,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        router_aux_loss_coef=0.001,
    ),
    # Qwen2.5-Math-7B's shape (Qwen2: biased q/k/v, no head_dim key: hidden_size / heads = 128).
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "sliding_window": 4096,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
    },
}


def hub_config(name: str) -> dict[str, Any] | None:
    """The published config.json values of hub model `name` (e.g. "Qwen/Qwen3-0.6B"), a copy; None
    for a model not in the table."""
    values = HUB_CONFIGS.get(name)
    return None if values is None else {**values}


def transformers_config(name: str, **overrides: Any) -> PretrainedConfig:
    """The transformers config of hub model `name` from the table, with `overrides` (e.g.
    num_hidden_layers=2 for a model of the same widths but fewer layers); KeyError for a model not in
    the table (see HUB_CONFIGS)."""
    from transformers import AutoConfig  # only here: `rl` and `sft` check a bad config without loading it

    values = {**HUB_CONFIGS[name], **overrides}
    values.pop("architectures")
    values.pop("torch_dtype")
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    config.architectures = list(HUB_CONFIGS[name]["architectures"])
    return config
