"""An adapter trained on an NF4 base, served by vLLM on the full-precision base (as after training, or
as `lorarl-merge` merges it) rather than on the base as the trainer saw it (the run's served_base/).

The adapter is trained here, a few AdamW steps of next-token loss on random rows with lorarl's own
loading (model.quantization = "nf4", LoRA rank 8 on the 7 projections). Then, for each base vLLM can
serve it on (each vLLM in a process of its own), the logprob of every token of held-out rows with the
adapter, against the trainer's own (its 4-bit base and the adapter): the mean and the largest
|difference|. The same without the adapter shows how much of the gap is the base's quantization.

    python -m lorarl.tiny_model outputs/models/qwen3-0.6b-random --shape Qwen/Qwen3-0.6B
    flock /tmp/lorarl-heavy.lock .venv/bin/python benchmarks/qlora_full_base.py outputs/models/qwen3-0.6b-random

Table and figures: docs/qlora.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import psutil

from runner import json_from_child, markdown_head, markdown_row

RANK, ROWS, LENGTH = 8, 8, 64


def rows(vocab: int, seed: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (ROWS, LENGTH), generator=generator).tolist()


def train(model_dir: str, dtype: str, steps: int, out: Path) -> dict[str, list[list[float]]]:
    """Train the adapter into out/adapter and write the served base into out/served_base; return the
    trainer's logprobs of the held-out rows, with and without the adapter."""
    import torch

    from lorarl.config.model import LoraConfig, ModelConfig
    from lorarl.quantized_base import write_served_base
    from lorarl.trainer.model import apply_lora, load_model, save_adapter

    torch.manual_seed(0)
    lora = LoraConfig(rank=RANK)
    cfg = ModelConfig(name=model_dir, dtype=dtype, quantization="nf4", lora=lora)  # type: ignore[arg-type]
    model = apply_lora(load_model(cfg), lora)
    vocab = model.config.vocab_size
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    train_ids = torch.tensor(rows(vocab, seed=1))
    for _ in range(steps):
        model(train_ids, labels=train_ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    save_adapter(model, out / "adapter")
    (out / "served_base").mkdir()
    write_served_base(cfg, out / "served_base")
    held_out = torch.tensor(rows(vocab, seed=2))
    with torch.no_grad():
        found = {"adapter": token_logprobs(model, held_out)}
        with model.disable_adapter():
            found["base"] = token_logprobs(model, held_out)
    return found


def token_logprobs(model: object, ids: object) -> list[list[float]]:
    """The logprob of each token after the first of each row of `ids`."""
    import torch

    logits = model(ids).logits[:, :-1].float()  # type: ignore[operator]
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0].tolist()  # type: ignore[index]


def served(model_dir: str, tokenizer: str, dtype: str, adapter: str, vocab: int) -> dict[str, list[list[float]]]:
    """vLLM's prompt logprobs of the held-out rows on base `model_dir`, with and without `adapter`."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from lorarl.inference.server import CPU_LORA_EXTENSION

    # As `rl` starts it on a CPU: lorarl's LoRA ops (vLLM's own fail on prompt logprobs with an adapter).
    llm = LLM(model=model_dir, tokenizer=tokenizer, dtype=dtype, max_model_len=LENGTH + 8, enable_lora=True,  # type: ignore[arg-type]
              max_lora_rank=RANK, enforce_eager=True, seed=0, worker_extension_cls=CPU_LORA_EXTENSION)  # fmt: skip
    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    prompts = [TokensPrompt(prompt_token_ids=row) for row in rows(vocab, seed=2)]
    found = {}
    for name, lora in (("adapter", LoRARequest("trained", 1, adapter)), ("base", None)):
        outputs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        found[name] = [
            [entry[token].logprob for entry, token in zip(o.prompt_logprobs[1:], row[1:], strict=True)]  # type: ignore[index]
            for o, row in zip(outputs, rows(vocab, seed=2), strict=True)
        ]
    return found


def gaps(ours: list[list[float]], theirs: list[list[float]]) -> tuple[float, float]:
    diffs = [abs(a - b) for r, s in zip(ours, theirs, strict=True) for a, b in zip(r, s, strict=True)]
    return sum(diffs) / len(diffs), max(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model folder (lorarl.tiny_model --shape Qwen/Qwen3-0.6B)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=20, help="training steps of the adapter")
    parser.add_argument("--train", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=3, metavar=("BASE", "ADAPTER", "VOCAB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:
        print(json.dumps(train(args.model, args.dtype, args.steps, Path(args.train))))
        return
    if args.serve:
        base, adapter, vocab = args.serve
        print(json.dumps(served(base, args.model, args.dtype, adapter, int(vocab))), flush=True)
        # The CPU build's engine threads abort a normal interpreter exit ("terminate called"), and leaving
        # by os._exit alone orphans its engine and worker processes (7.6 GiB of them were left running).
        for child in psutil.Process().children(recursive=True):
            child.kill()
        os._exit(0)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:
        common = [__file__, str(Path(args.model)), "--dtype", args.dtype, "--steps", str(args.steps)]
        trainer = json_from_child([*common, "--train", tmp])
        bases = (("served_base/ (the trainer's 4-bit base, dequantized)", f"{tmp}/served_base"),
                 ("the full-precision base", str(Path(args.model))))  # fmt: skip
        print(markdown_head(["vLLM serves the adapter on", "mean |Δ logprob| vs trainer", "max",
                             "without the adapter: mean", "max"]))  # fmt: skip
        for name, base in bases:
            vllm = json_from_child([*common, "--serve", base, f"{tmp}/adapter", str(vocab)])
            with_adapter, without = gaps(vllm["adapter"], trainer["adapter"]), gaps(vllm["base"], trainer["base"])
            print(markdown_row([name, *(f"{x:.2e}" for x in (*with_adapter, *without))]), flush=True)


if __name__ == "__main__":
    main()
