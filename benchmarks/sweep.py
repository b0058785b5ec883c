"""What a sweep in one run ([[variants]]: several LoRA adapters on one base) costs against its variants
trained apart, measured three ways, one subcommand each:

    python benchmarks/sweep.py runs --steps 5            # `rl` of the sweep against its variants' own runs
    python benchmarks/sweep.py vllm                      # vLLM alone: one step's batch per variant
    python benchmarks/sweep.py trainer --ks 1 2 4 --steps 3   # the trainer alone: K variants against K runs

Tables: docs/rank_sweep.md (runs, vllm) and docs/benchmarks.md (trainer).

`runs` and `vllm` take an rl config with [[variants]] (--config, default configs/rank_sweep/rl.toml: ranks
1, 4, 16, 64; run the quickstart first, whose warm-up it starts from) and measure it with vLLM's own CPU
LoRA ops and with lorarl's (cpu/lora_ops.py).

runs: for vLLM's ops, then lorarl's, `rl` of the sweep for --steps steps, then `rl` of each variant's
effective config (RLConfig.variant_configs: the same settings and batches as in the sweep) for as many,
one after another. Per run: the wall time of the `rl` process (start to exit, vLLM's start included),
the seconds per step once running (the orchestrator's batches from step 1 to the last, over steps - 1),
and where they go: the trainer's busy seconds per step (its time/step less its wait for a batch, summed
over variants) and the vLLM fleet's (its busy fraction times the step time).

vllm: the server `rl` would start for the config (server.vllm_command: its --max-lora-rank, CPU pinning
and LoRA ops), an adapter of each variant's rank and targets loaded, and the seconds of one step's batch
(orchestrator.batch_size rollouts of random 24-token prompts, sampling.max_tokens tokens each) of the
base model and of each variant alone, then of all variants' batches at once, as the sweep sends them.

trainer: peak memory and step time of K adapters trained in one run against K separate runs, on the
mid-size Qwen3 config of benchmarks/lora_vs_full.py (8 layers, hidden 512, vocab 32000). Every run is
the real RL trainer (`lorarl-trainer`, its own process) on rollout batches of random tokens written
beforehand, so it never waits. For each K: K separate runs, one after another (each a single-adapter
run of --rank), against one run with K variants (that rank, lr apart, on the same batches). Reported
per K: the peak resident memory of the one run against the sum of the K runs' peaks (what running
them side by side takes: each holds its own copy of the base), and the time of one step of all K
adapters, the sum of the variants' `time/step` in the one run, against the sum of the K runs'
`time/step`, the first step (warm-up) left out. CPU only as written: peaks are the processes' max RSS
(`memory/peak_gib`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lorarl.cli.rl as rl
import lorarl.inference.server as server
from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.inference.client import InferenceClient
from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder
from lorarl.tiny_model import build_model
from lorarl.trainer.model import apply_lora, load_model
from lorarl.variants import variant_configs
from runner import ENV, Row, cli, markdown_head, markdown_row, metrics_rows, steady_rows, vllm_server

OPS = {"vLLM's": True, "lorarl's": False}  # the LoRA ops of a CPU server: stock (vLLM's) or not
# This file's entry for `rl` with vLLM's own CPU LoRA ops (rl_with_stock_ops), ahead of its subcommands.
STOCK_OPS = "--rl-with-stock-ops"


def run_config(entry: Sequence[str], config: dict[str, Any], run_dir: Path) -> float:
    """`entry @ config` (a lorarl CLI, the config written as JSON beside the run folder) in a process of
    its own; its wall seconds. Exits with the tail of its stderr if it fails."""
    path = run_dir.parent / f"{run_dir.name}.json"
    path.write_text(json.dumps(config))
    start = time.perf_counter()
    done = subprocess.run([*entry, "@", str(path)], capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise SystemExit(f"{run_dir.name} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def summed_per_step(rows: list[Row], value: Callable[[Row], float]) -> float:
    """The mean over the steps after the first of `value` summed over each step's rows (one per variant)."""
    sums: dict[int, float] = {}
    for row in steady_rows(rows):
        sums[row["step"]] = sums.get(row["step"], 0.0) + value(row)
    return statistics.fmean(sums.values())


# runs


def without_cpu_lora(cmd: list[str]) -> list[str]:
    """A vLLM command (or its arguments) less the cpu_lora extension: vLLM's own CPU LoRA ops."""
    at = cmd.index("--worker-extension-cls")
    assert cmd[at + 1] == server.CPU_LORA_EXTENSION, cmd
    return cmd[:at] + cmd[at + 2 :]


def rl_with_stock_ops(argv: list[str]) -> None:
    """`rl` whose vLLM servers run vLLM's own CPU LoRA ops (this file's STOCK_OPS entry)."""
    lora_args = server.lora_args

    def stock_lora_args(adapters: server.Adapters, gpus: int, with_slots: bool = True) -> list[str]:
        return without_cpu_lora(lora_args(adapters, gpus, with_slots))

    server.lora_args = stock_lora_args  # what vllm_command calls
    rl.main(argv)


def run_rl(cfg: RLConfig, stock: bool) -> dict[str, float]:
    """`rl` of `cfg` in a process of its own; its figures (the module docstring's `runs`)."""
    entry = [sys.executable, __file__, STOCK_OPS] if stock else cli("rl")
    wall = run_config(entry, cfg.model_dump(mode="json"), cfg.run_dir)
    return {"wall": wall, **step_figures(metrics_rows(cfg.run_dir), cfg.max_steps)}


def step_figures(rows: list[Row], steps: int) -> dict[str, float]:
    """Seconds per step from the orchestrator rows' clocks (the last variant's batch of each step),
    the trainer's busy seconds per step summed over variants and the fleet's, both after step 1."""
    orchestrator = [r for r in rows if r["component"] == "orchestrator"]
    written = {s: max(r["time"] for r in orchestrator if r["step"] == s) for s in (1, steps)}
    per_step = (written[steps] - written[1]) / (steps - 1)
    trainer = [r for r in rows if r["component"] == "trainer"]
    busy = summed_per_step(trainer, lambda r: r["time/step"] - r["time/wait_for_batch"])
    # The fleet is one for all variants: its busy fraction is the same in each variant's rows.
    fleet = statistics.fmean(r["inference/busy_frac"] for r in steady_rows(orchestrator))
    return {"per_step": per_step, "trainer": busy, "vllm": fleet * per_step}


def measure_runs(args: argparse.Namespace, folder: Path) -> None:
    cfg = load_config(RLConfig, ["@", args.config])
    runs = [("sweep", cfg), *variant_configs(cfg)]
    print(f"{args.steps} steps of {cfg.run_name}: the sweep, then each variant alone", flush=True)
    print(markdown_head(["LoRA ops", "run", "wall s", "s / step", "trainer s / step", "vLLM busy s / step"]))
    for ops, stock in OPS.items():
        alone = []
        for name, run_cfg in runs:
            named = {"run_name": f"{name}-{'stock' if stock else 'cpu_lora'}", "max_steps": args.steps}
            figures = run_rl(run_cfg.model_copy(update={**named, "output_dir": folder}), stock)
            alone += [figures] if name != "sweep" else []
            print(runs_row(ops, name, figures), flush=True)
        print(runs_row(ops, "variants alone, summed", {k: sum(f[k] for f in alone) for k in alone[0]}), flush=True)


def runs_row(ops: str, name: str, f: dict[str, float]) -> str:
    return markdown_row([ops, name, f"{f['wall']:.0f}", f"{f['per_step']:.2f}", f"{f['trainer']:.2f}",
                         f"{f['vllm']:.2f}"])  # fmt: skip


# vllm


async def batch_seconds(client: InferenceClient, model: str, cfg: RLConfig, prompts: list[list[int]]) -> float:
    """Seconds for one step's batch of `model`: every prompt sampled rollouts_per_example times."""
    sampling, n = cfg.orchestrator.sampling, cfg.orchestrator.rollouts_per_example
    start = time.perf_counter()
    await asyncio.gather(
        *(
            client.complete(model, p, n, sampling.temperature, 1.0, sampling.max_tokens, ignore_eos=True)
            for p in prompts
        )
    )
    return time.perf_counter() - start


async def time_batches(cfg: RLConfig, ops: str, adapters: dict[str, Path]) -> None:
    client = InferenceClient(server.worker_urls(cfg)[0])
    rng = random.Random(0)
    groups = cfg.orchestrator.batch_size // cfg.orchestrator.rollouts_per_example
    prompts = [[rng.randrange(3, 250) for _ in range(24)] for _ in range(groups)]
    try:
        for name, path in adapters.items():
            await client.load_adapter(name, str(path))
            await batch_seconds(client, name, cfg, prompts)  # warm-up: the first batch compiles kernels
        for name in ["base model", *adapters]:
            model = cfg.model.name if name == "base model" else name
            seconds = [await batch_seconds(client, model, cfg, prompts) for _ in range(3)]
            print(markdown_row([ops, name, f"{statistics.median(seconds):.2f}"]), flush=True)
        start = time.perf_counter()
        await asyncio.gather(*(batch_seconds(client, name, cfg, prompts) for name in adapters))
        print(markdown_row([ops, f"all {len(adapters)} at once", f"{time.perf_counter() - start:.2f}"]), flush=True)
    finally:
        await client.close()


def measure_vllm(args: argparse.Namespace, folder: Path) -> None:
    cfg = load_config(RLConfig, ["@", args.config])
    adapters = {}
    for name, variant in variant_configs(cfg):
        adapters[name] = folder / name
        apply_lora(load_model(variant.model), variant.lora).save_pretrained(str(adapters[name]))
    ours = server.vllm_command(cfg, server.rl_adapters(cfg, experts=False), gpus=0)  # a CPU benchmark of dense LoRA
    print(f"--max-lora-rank {ours[ours.index('--max-lora-rank') + 1]}", flush=True)
    print(markdown_head(["LoRA ops", "batch", "s (median of 3)"]), flush=True)
    env = {**ENV, **server.vllm_env(cfg)}
    for ops, stock in OPS.items():
        cmd, log = without_cpu_lora(ours) if stock else ours, folder / f"vllm-{ops}.log"
        with vllm_server(cmd, server.worker_urls(cfg), log, env, cfg.inference.startup_timeout):
            asyncio.run(time_batches(cfg, ops, adapters))


# trainer


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


def run_trainer(
    args: argparse.Namespace, folder: Path, run_name: str, variants: list[dict[str, Any]]
) -> tuple[float, float]:
    """The trainer of one run (of `variants`, or of one adapter), its batches written beforehand: its peak
    memory (GiB) and its steady step time summed over variants."""
    root = RunFolder(folder / run_name).create()
    for run in [root.for_variant(v["name"]) for v in variants] or [root]:
        write_batches(run, args.steps, args.batch, args.prompt, args.completion, args.vocab)
    config = {"max_steps": args.steps, "seq_len": args.prompt + args.completion, "output_dir": str(folder),
              "run_name": run_name, "monitor": {"console": False},
              "model": {"name": str(folder / "model"), "lora": {"rank": args.rank, "alpha": 32}},
              "trainer": {"micro_batch_size": args.batch, "num_threads": args.threads},
              "variants": variants}  # fmt: skip
    run_config(cli("trainer"), config, folder / run_name)
    rows = metrics_rows(folder / run_name, "trainer")
    return max(r["memory/peak_gib"] for r in rows), summed_per_step(rows, lambda r: r["time/step"])


def measure_trainer(args: argparse.Namespace, folder: Path) -> None:
    build_model(args.vocab, eos_token_id=1, pad_token_id=0, hidden_size=args.hidden,
                num_layers=args.layers).save_pretrained(folder / "model")  # fmt: skip
    print(f"Qwen3 {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; LoRA rank {args.rank}; "
          f"{args.batch} rollouts of {args.prompt} + {args.completion} tokens per step and adapter; "
          f"{args.steps} steps, {args.threads} threads", flush=True)  # fmt: skip
    print(markdown_head(["K", "one run: peak GiB", "K runs: summed peak GiB", "memory saved", "one run: s / step",
                         "K runs: summed s / step"]), flush=True)  # fmt: skip
    for k in args.ks:
        separate = [run_trainer(args, folder, f"k{k}-alone-{i}", []) for i in range(k)]
        variants = [{"name": f"v{i}", "trainer": {"optim": {"lr": 1e-4 * (i + 1)}}} for i in range(k)]
        together_mem, together_time = run_trainer(args, folder, f"k{k}-sweep", variants)
        apart_mem, apart_time = sum(m for m, _ in separate), sum(t for _, t in separate)
        print(markdown_row([k, f"{together_mem:.2f}", f"{apart_mem:.2f}", f"{1 - together_mem / apart_mem:.0%}",
                            f"{together_time:.2f}", f"{apart_time:.2f}"]), flush=True)  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == [STOCK_OPS]:
        return rl_with_stock_ops(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = parser.add_subparsers(dest="part", required=True)

    def part(name: str, what: str) -> argparse.ArgumentParser:
        return parts.add_parser(name, help=what, description=f"{what}; how it measures: sweep.py --help")

    runs = part("runs", "`rl` of the sweep against each variant's own run, with each LoRA ops")
    runs.add_argument("--config", default="configs/rank_sweep/rl.toml", help="an rl config with [[variants]]")
    runs.add_argument("--steps", type=int, default=5)
    vllm = part("vllm", "vLLM alone: the seconds of one step's batch per variant, with each LoRA ops")
    vllm.add_argument("--config", default="configs/rank_sweep/rl.toml", help="an rl config with [[variants]]")
    trainer = part("trainer", "the trainer alone: memory and step time of K variants against K runs")
    trainer.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    trainer.add_argument("--layers", type=int, default=8)
    trainer.add_argument("--hidden", type=int, default=512)
    trainer.add_argument("--vocab", type=int, default=32000)
    trainer.add_argument("--rank", type=int, default=16)
    trainer.add_argument("--batch", type=int, default=8, help="rollouts per step and adapter")
    trainer.add_argument("--prompt", type=int, default=64)
    trainer.add_argument("--completion", type=int, default=192)
    trainer.add_argument("--steps", type=int, default=3)
    trainer.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    measure = {"runs": measure_runs, "vllm": measure_vllm, "trainer": measure_trainer}[args.part]
    with tempfile.TemporaryDirectory() as tmp:
        measure(args, Path(tmp))


if __name__ == "__main__":
    main()
