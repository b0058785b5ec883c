"""Build a tiny Qwen3 model and tokenizer locally, as an ordinary Hugging Face folder.

No model hub is reachable on the machines lorarl is developed and tested on, so the quickstart
and the tests train this model. It is a regular Qwen3 checkpoint: transformers, PEFT and vLLM load
it like any other (vLLM's CPU attention needs head_dim >= 32, hence 32 by default).

    python -m lorarl.tiny_model outputs/models/tiny-qwen3
    python -m lorarl.tiny_model outputs/models/qwen3-24m --hidden-size 512 --num-layers 8 --head-dim 64

The second is the 24M-parameter model of the throughput benchmark (scripts/benchmark_throughput.py).
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

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


def build_model(
    vocab_size: int,
    eos_token_id: int,
    pad_token_id: int,
    hidden_size: int = 128,
    num_layers: int = 4,
    seed: int = 0,
    head_dim: int = 32,
) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // head_dim,
        num_key_value_heads=max(1, hidden_size // head_dim // 2),
        head_dim=head_dim,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def save_tiny_model(out: Path, hidden_size: int = 128, num_layers: int = 4, seed: int = 0, head_dim: int = 32) -> Path:
    tokenizer = build_tokenizer()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert eos is not None and pad is not None
    model = build_model(len(tokenizer), eos, pad, hidden_size, num_layers, seed, head_dim)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--head-dim", type=int, default=32, help="at least 32 (vLLM's CPU attention)")
    args = parser.parse_args()
    save_tiny_model(args.out, args.hidden_size, args.num_layers, args.seed, args.head_dim)
    n = sum(p.numel() for p in Qwen3ForCausalLM.from_pretrained(args.out).parameters())
    print(f"wrote {args.out} ({n / 1e6:.2f}M parameters)")


if __name__ == "__main__":
    main()
