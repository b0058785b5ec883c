"""Build a tiny Qwen3 model and tokenizer locally, as an ordinary Hugging Face folder.

No model hub is reachable on the machines lorarl is developed and tested on, so the quickstart
and the tests train this model. It is a regular Qwen3 checkpoint: transformers, PEFT and vLLM load
it like any other (vLLM's CPU attention needs head_dim >= 32, hence 32 by default).

    python -m lorarl.tiny_model outputs/models/tiny-qwen3
    python -m lorarl.tiny_model outputs/models/qwen3-24m --hidden-size 512 --num-layers 8 --head-dim 64

The second is the 24M-parameter model of the throughput benchmark (benchmarks/throughput.py).

`--num-experts` builds a Qwen3-MoE instead (every layer a sparse block of that many experts, top-2), on
which expert LoRA is trained and served (docs/moe.md; scripts/gpu_moe_acceptance.sh):

    python -m lorarl.tiny_model outputs/models/tiny-qwen3-moe --num-experts 4

`--shape` builds a model of a published hub model's exact config (lorarl/model_shapes.py: Qwen3-0.6B,
1.7B, 4B, ...) with random weights and this local tokenizer; its vocabulary stays the published one
(151,936 for Qwen3), larger than the tokenizer's 259 tokens as real Qwen3's is larger than its own
tokenizer. `--vocab-size` does the same for a small custom shape. The real-shape benchmarks
(benchmarks/shapes.py) and the GPU acceptance run (scripts/gpu_acceptance.sh) train these:

    python -m lorarl.tiny_model outputs/models/qwen3-0.6b-random --shape Qwen/Qwen3-0.6B
    python -m lorarl.tiny_model outputs/models/qwen3-4b-random --shape Qwen/Qwen3-4B --dtype bfloat16
    python -m lorarl.tiny_model outputs/models/h256-v151936 --hidden-size 256 --num-layers 2 --vocab-size 151936
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from lorarl.model_shapes import HUB_CONFIGS, transformers_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3's chat template (Qwen/Qwen3-8B tokenizer_config.json) for everything but reasoning: the
# tools block in the system message, assistant `tool_calls` as <tool_call> JSON, `tool` messages as
# <tool_response> in a user turn (consecutive ones merged), and `enable_thinking = false` opening
# the answer with an empty <think> block. Left out: splitting `<think>` off assistant turns, which
# this model (no thinking mode) has no use for; without tools it renders plain ChatML.
QWEN3_TEMPLATE = """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
       + "function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
       + "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": "
       + "<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content or '' %}
        {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level byte-level BPE: every character is its own token, so a model this small
    can learn character tasks (reversal, sorting) without having to learn sub-word spelling."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("."), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(SPECIAL_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([string.printable], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=QWEN3_TEMPLATE,
    )


def shape_config(shape: str, eos_token_id: int, pad_token_id: int, num_layers: int | None = None) -> PretrainedConfig:
    """The published config of hub model `shape` (lorarl/model_shapes.py), with this tokenizer's
    special tokens (the published ids are the hub tokenizer's) and optionally fewer layers."""
    overrides = {} if num_layers is None else {"num_hidden_layers": num_layers, "max_window_layers": num_layers}
    return transformers_config(
        shape, eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=None, **overrides
    )


def tiny_config(
    vocab_size: int, eos_token_id: int, pad_token_id: int, hidden_size: int, num_layers: int, head_dim: int
) -> dict[str, Any]:
    """The tiny model's config values, dense or MoE: its widths, attention heads and special tokens."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 3 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": hidden_size // head_dim,
        "num_key_value_heads": max(1, hidden_size // head_dim // 2),
        "head_dim": head_dim,
        "max_position_embeddings": 2048,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": True,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "bos_token_id": None,
        "dtype": "float32",
    }


def build_model(
    vocab_size: int,
    eos_token_id: int,
    pad_token_id: int,
    hidden_size: int = 128,
    num_layers: int = 4,
    seed: int = 0,
    head_dim: int = 32,
) -> Qwen3ForCausalLM:
    config = Qwen3Config(**tiny_config(vocab_size, eos_token_id, pad_token_id, hidden_size, num_layers, head_dim))
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def build_moe_model(
    vocab_size: int,
    eos_token_id: int,
    pad_token_id: int,
    num_experts: int,
    hidden_size: int = 128,
    num_layers: int = 4,
    seed: int = 0,
    head_dim: int = 32,
) -> Qwen3MoeForCausalLM:
    """A Qwen3-MoE of the tiny model's widths: every layer a sparse block of `num_experts` experts
    (top-2) of width hidden_size / 2, so that an expert's fused gate_up_proj (2 x width) and its
    down_proj (hidden_size) differ in shape and a layout mix-up cannot pass unnoticed."""
    config = Qwen3MoeConfig(
        **tiny_config(vocab_size, eos_token_id, pad_token_id, hidden_size, num_layers, head_dim),
        moe_intermediate_size=hidden_size // 2,
        num_experts=num_experts,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    )
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(config)


def random_model(config: PretrainedConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A model of `config` with random weights, made in `dtype` from the start (Qwen3-4B in float32
    would need 16 GB on the way to bfloat16's 8)."""
    config.dtype = dtype
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def special_ids(tokenizer: PreTrainedTokenizerFast) -> tuple[int, int]:
    """The tokenizer's end-of-sequence and padding ids, which every model built here is given."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert eos is not None and pad is not None
    return eos, pad


def save_model(out: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> Path:
    eos, pad = special_ids(tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def save_tiny_model(
    out: Path,
    hidden_size: int = 128,
    num_layers: int = 4,
    seed: int = 0,
    head_dim: int = 32,
    vocab_size: int | None = None,
    num_experts: int = 0,
) -> Path:
    """The tiny model (a custom shape), its vocabulary the tokenizer's unless `vocab_size` is given;
    with `num_experts` a Qwen3-MoE of that many experts."""
    tokenizer = build_tokenizer()
    eos, pad = special_ids(tokenizer)
    vocab = len(tokenizer) if vocab_size is None else vocab_size
    shape = (hidden_size, num_layers, seed, head_dim)
    if num_experts:
        return save_model(out, build_moe_model(vocab, eos, pad, num_experts, *shape), tokenizer)
    model = build_model(vocab, eos, pad, *shape)
    return save_model(out, model, tokenizer)


def save_shaped_model(
    out: Path,
    shape: str,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    num_layers: int | None = None,
    weights: bool = True,
) -> Path:
    """A model of hub model `shape`'s published config (its vocabulary too) with random weights and
    the local tokenizer. `weights=False`: the config and tokenizer alone, which is all that a dry run
    and its memory plan read (Qwen3-4B's weights are 8 GB even in bfloat16)."""
    tokenizer = build_tokenizer()
    eos, pad = special_ids(tokenizer)
    config = shape_config(shape, eos, pad, num_layers)
    if weights:
        return save_model(out, random_model(config, seed, dtype), tokenizer)
    config.dtype = dtype
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(HUB_CONFIGS), help="a published model's exact config")
    parser.add_argument("--num-layers", type=int, help="default: 4, or the shape's")
    parser.add_argument("--seed", type=int, default=0)
    custom = parser.add_argument_group("the tiny model's shape (without --shape)")
    custom.add_argument("--hidden-size", type=int)
    custom.add_argument("--head-dim", type=int, help="at least 32 (vLLM's CPU attention)")
    custom.add_argument("--vocab-size", type=int, help="default: the tokenizer's 259")
    custom.add_argument("--num-experts", type=int, default=0, help="a Qwen3-MoE of this many experts (top-2)")
    shaped = parser.add_argument_group("with --shape")
    shaped.add_argument("--dtype", choices=sorted(DTYPES), help="of the weights written (default float32)")
    shaped.add_argument("--config-only", action="store_true", help="no weights (for --dry-run)")
    args = parser.parse_args()
    if args.shape is not None:
        if any(v is not None for v in (args.hidden_size, args.head_dim, args.vocab_size)) or args.num_experts:
            parser.error(
                "--hidden-size, --head-dim, --vocab-size and --num-experts are the tiny model's; --shape fixes them"
            )
        dtype = DTYPES[args.dtype or "float32"]
        save_shaped_model(args.out, args.shape, dtype, args.seed, args.num_layers, not args.config_only)
    elif args.dtype is not None or args.config_only:
        parser.error("--dtype and --config-only are for --shape models; the tiny model is float32")
    else:
        shape = {
            "hidden_size": args.hidden_size or 128,
            "head_dim": args.head_dim or 32,
            "num_layers": args.num_layers or 4,
        }
        save_tiny_model(args.out, seed=args.seed, vocab_size=args.vocab_size, num_experts=args.num_experts, **shape)
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.out)).parameters())
    print(f"wrote {args.out} ({n / 1e6:.2f}M parameters{', config only' if args.config_only else ''})")


if __name__ == "__main__":
    main()
