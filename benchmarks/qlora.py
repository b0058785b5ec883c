"""The trainer's base with and without model.quantization = "nf4", at Qwen3-0.6B's shape (random weights).

For each (dtype, quantization), in a process of its own: the bytes of the base the trainer holds (every
weight and 4-bit scale, a tied weight once), the process's resident memory after loading it, and, with a
LoRA adapter of rank 8 on the 7 projections, the peak resident memory and the time of one forward and
backward pass over one row of --tokens tokens (the fastest of --steps; the machine is shared).

    python -m lorarl.tiny_model outputs/models/qwen3-0.6b-random --shape Qwen/Qwen3-0.6B
    flock /tmp/lorarl-heavy.lock .venv/bin/python benchmarks/qlora.py outputs/models/qwen3-0.6b-random

Table and figures: docs/qlora.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from runner import json_from_child, markdown_head, markdown_row

ROWS = (("float32", "none"), ("float32", "nf4"), ("bfloat16", "none"), ("bfloat16", "nf4"))


def rss_gib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def measure(model_dir: str, dtype: str, quantization: str, tokens: int, steps: int) -> dict[str, object]:
    """One row of the table, in this process."""
    import torch

    from lorarl.config.model import LoraConfig, ModelConfig
    from lorarl.quantized_base import held_bytes
    from lorarl.trainer.model import apply_lora, load_model

    torch.manual_seed(0)
    cfg = ModelConfig(name=model_dir, dtype=dtype, quantization=quantization, lora=LoraConfig(rank=8))  # type: ignore[arg-type]
    before = rss_gib()
    start = time.perf_counter()
    base = load_model(cfg)
    load_s = time.perf_counter() - start
    row: dict[str, object] = {"dtype": dtype, "quantization": quantization, "load_s": round(load_s, 1)}
    row["base_gib"] = held_bytes(base) / 2**30
    row["rss_after_load_gib"] = rss_gib() - before
    model = apply_lora(base, cfg.lora)  # type: ignore[arg-type]
    model.train()
    ids = torch.randint(0, 259, (1, tokens))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(ids, labels=ids).loss.backward()
        times.append(time.perf_counter() - start)
    row["step_s"] = round(min(times), 2)
    row["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model folder (lorarl.tiny_model --shape Qwen/Qwen3-0.6B)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("DTYPE", "QUANTIZATION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        dtype, quantization = args.one
        print(json.dumps(measure(args.model, dtype, quantization, args.tokens, args.steps)))
        return
    rows = []
    for dtype, quantization in ROWS:
        flags = [str(Path(args.model)), "--tokens", str(args.tokens), "--steps", str(args.steps)]
        rows.append(json_from_child([__file__, *flags, "--one", dtype, quantization]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(markdown_head(["dtype", "quantization", "base held (GiB)", "vs the same dtype unquantized",
                         "RSS after load (GiB)", "peak RSS (GiB)", "fwd+bwd step (s)"]))  # fmt: skip
    for row in rows:
        plain = next(r for r in rows if r["dtype"] == row["dtype"] and r["quantization"] == "none")
        memory = [f"{row['base_gib']:.3f}", f"{row['base_gib'] / plain['base_gib']:.2f}x",
                  f"{row['rss_after_load_gib']:.2f}", f"{row['peak_rss_gib']:.2f}"]  # fmt: skip
        print(markdown_row([row["dtype"], row["quantization"], *memory, row["step_s"]]))


if __name__ == "__main__":
    main()
