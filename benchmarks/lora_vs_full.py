"""Trainer step time and peak memory: LoRA vs full fine-tuning on a mid-size Qwen3 config.

    python benchmarks/lora_vs_full.py --layers 8 --hidden 512 --batch 16 --seq 256 --steps 5

Each mode runs in its own process (so peak memory is its own): one RL trainer step is the
trainer's real forward/backward (`micro_batch_loss`) on random tokens plus an AdamW step.
Peak memory is the process's max RSS on CPU, max allocated on GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from lorarl.config.algorithms import PPOLoss
from lorarl.config.model import LoraConfig, ModelConfig
from lorarl.config.trainer import OptimConfig
from lorarl.trainer.batching import TrainSample, micro_batches
from lorarl.trainer.loss import LossNorm, micro_batch_loss
from lorarl.trainer.model import TrainedModel, apply_lora, load_model, parameter_summary, peak_memory_gib
from lorarl.trainer.optim import build_optimizer
from runner import after_warmup, json_from_child, markdown_head, markdown_row


def build(folder: Path, layers: int, hidden: int, vocab: int) -> None:
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128), head_dim=64,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(folder)


def one_mode(folder: Path, mode: str, batch: int, seq: int, micro: int, steps: int, vocab: int) -> dict[str, float]:
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model: TrainedModel = load_model(ModelConfig(name=str(folder)))
    if mode == "lora":
        model = apply_lora(model, LoraConfig(rank=8, alpha=16))
    model.to(device)  # type: ignore[arg-type]  # transformers 5 types PreTrainedModel.to as unbound
    optimizer = build_optimizer(model, OptimConfig(lr=1e-5))
    rng = random.Random(0)
    samples = [
        TrainSample(
            input_ids=[rng.randrange(vocab) for _ in range(seq)],
            loss_mask=[False] * (seq // 2) + [True] * (seq - seq // 2),
            old_logprobs=[0.0] * (seq // 2) + [-1.0] * (seq - seq // 2),
            advantage=rng.uniform(-1, 1),
        )
        for _ in range(batch)
    ]
    loss_cfg = PPOLoss()
    norm = LossNorm.for_step(loss_cfg, samples)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for mb in micro_batches(samples, micro, pad_id=0):
            loss, _ = micro_batch_loss(model, mb.to(device), loss_cfg, norm)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    summary = parameter_summary(model)
    return {
        "step_s": statistics.median(after_warmup(times)),
        "peak_memory_gib": peak_memory_gib(device),
        "trainable_params": summary["params/trainable"],
        "total_params": summary["params/total"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mode", choices=["lora", "full"], help="(internal) run one mode and print JSON")
    parser.add_argument("--model", type=Path, help="(internal) the model folder")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(one_mode(args.model, args.mode, args.batch, args.seq, args.micro, args.steps, args.vocab)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        build(folder, args.layers, args.hidden, args.vocab)
        results = {
            mode: json_from_child([__file__, "--mode", mode, "--model", str(folder), *sys.argv[1:]])
            for mode in ("lora", "full")
        }
    print(f"Qwen3 {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}: "
          f"batch {args.batch} x {args.seq} tokens, micro-batch {args.micro}")  # fmt: skip
    print(markdown_head(["mode", "trainable", "step (s)", "peak memory (GiB)"]))
    for mode, r in results.items():
        print(markdown_row([mode, f"{r['trainable_params']:,}", f"{r['step_s']:.2f}", f"{r['peak_memory_gib']:.2f}"]))


if __name__ == "__main__":
    main()
