"""Peak memory and step time of K adapters trained in one run ([[variants]]) against K separate runs.

    python benchmarks/variants.py --ks 1 2 4 --steps 3

On the mid-size Qwen3 config of benchmarks/lora_vs_full.py (8 layers, hidden 512, vocab 32000). Every
run is the real RL trainer (`python -m lorarl.cli.trainer @ config.json`, its own process) on rollout
batches of random tokens written beforehand, so it never waits. For each K: K separate runs, one
after another (each a single-adapter run of rank 16), against one run with K variants (ranks 16, lr
apart, on the same batches). Reported per K:

* memory: the peak resident memory of the one run, against the sum of the K runs' peaks (what
  running them side by side takes: each holds its own copy of the base);
* step time: the time of one step of all K adapters, the sum of the variants' `time/step` in the
  one run, against the sum of the K runs' `time/step`; the first step (warm-up) is left out.

CPU only as written: peaks are the processes' max RSS (`memory/peak_gib`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder
from lorarl.tiny_model import build_model


def write_batches(run: RunFolder, steps: int, batch: int, prompt: int, completion: int, vocab: int) -> None:
    rng = random.Random(0)  # the same batches for every run and variant
    for step in range(1, steps + 1):
        rollouts = [
            Rollout(prompt_ids=[rng.randrange(vocab) for _ in range(prompt)],
                    completion_ids=[rng.randrange(vocab) for _ in range(completion)],
                    completion_logprobs=[-1.0] * completion, completion_mask=[True] * completion,
                    advantage=rng.choice((-1.0, 1.0)), reward=0.0, policy_version=step - 1, temperature=1.0)
            for _ in range(batch)
        ]  # fmt: skip
        RolloutBatch(step, rollouts).write(run.rollouts(step))


def run_trainer(config: dict[str, Any], folder: Path) -> list[dict[str, Any]]:
    """The trainer process of `config`; its metrics rows."""
    path = folder / f"{config['run_name']}.json"
    path.write_text(json.dumps(config))
    subprocess.run([sys.executable, "-m", "lorarl.cli.trainer", "@", str(path)], check=True, capture_output=True)
    rows = (folder / config["run_name"] / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in rows]


def summary(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Peak memory (GiB) and the mean over steps after the first of the step time summed over variants."""
    per_step: dict[int, float] = {}
    for row in rows:
        if row["step"] > 1:
            per_step[row["step"]] = per_step.get(row["step"], 0.0) + row["time/step"]
    return max(r["memory/peak_gib"] for r in rows), statistics.fmean(per_step.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="rollouts per step and adapter")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=192)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_model(args.vocab, eos_token_id=1, pad_token_id=0, hidden_size=args.hidden,
                    num_layers=args.layers).save_pretrained(folder / "model")  # fmt: skip

        def config(run_name: str, variants: list[dict[str, Any]]) -> dict[str, Any]:
            cfg = {"max_steps": args.steps, "seq_len": args.prompt + args.completion, "output_dir": str(folder),
                   "run_name": run_name, "monitor": {"console": False},
                   "model": {"name": str(folder / "model"), "lora": {"rank": args.rank, "alpha": 32}},
                   "trainer": {"micro_batch_size": args.batch, "num_threads": args.threads},
                   "variants": variants}  # fmt: skip
            root = RunFolder(folder / run_name).create()
            for run in [root.for_variant(v["name"]) for v in variants] or [root]:
                write_batches(run, args.steps, args.batch, args.prompt, args.completion, args.vocab)
            return cfg

        print(f"Qwen3 {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; LoRA rank {args.rank}; "
              f"{args.batch} rollouts of {args.prompt} + {args.completion} tokens per step and adapter; "
              f"{args.steps} steps, {args.threads} threads", flush=True)  # fmt: skip
        print("| K | one run: peak GiB | K runs: summed peak GiB | memory saved | one run: s / step | "
              "K runs: summed s / step |\n|---|---|---|---|---|---|", flush=True)  # fmt: skip
        for k in args.ks:
            separate = [summary(run_trainer(config(f"k{k}-alone-{i}", []), folder)) for i in range(k)]
            variants = [{"name": f"v{i}", "trainer": {"optim": {"lr": 1e-4 * (i + 1)}}} for i in range(k)]
            together_mem, together_time = summary(run_trainer(config(f"k{k}-sweep", variants), folder))
            apart_mem, apart_time = sum(m for m, _ in separate), sum(t for _, t in separate)
            print(f"| {k} | {together_mem:.2f} | {apart_mem:.2f} | {1 - together_mem / apart_mem:.0%} "
                  f"| {together_time:.2f} | {apart_time:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
