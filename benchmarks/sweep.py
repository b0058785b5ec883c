"""What a sweep in one run ([[variants]]) costs against its variants as runs of their own, one after
another, with vLLM's own CPU LoRA ops and with lorarl's (cpu/lora_ops.py). Table: docs/rank_sweep.md.

    python benchmarks/sweep.py --steps 5   # the runs, with each ops in turn
    python benchmarks/sweep.py --vllm      # vLLM alone: one step's batch per variant, with each ops

Default config: configs/rank_sweep/rl.toml (ranks 1, 4, 16, 64; run the quickstart first, whose warm-up
it starts from).

The runs (default): for vLLM's ops, then lorarl's, `rl` of the sweep for --steps steps, then `rl` of each
variant's effective config (RLConfig.variant_configs: the same settings and batches as in the sweep) for
as many, one after another. Per run: the wall time of the `rl` process (start to exit, vLLM's start
included), the seconds per step once running (the orchestrator's batches from step 1 to the last, over
steps - 1), and where they go: the trainer's busy seconds per step (its time/step less its wait for a
batch, summed over variants) and the vLLM fleet's (its busy fraction times the step time).

--vllm: the server `rl` would start for the config (server.vllm_command: its --max-lora-rank, CPU pinning
and LoRA ops), an adapter of each variant's rank and targets loaded, and the seconds of one step's batch
(orchestrator.batch_size rollouts of random 24-token prompts, sampling.max_tokens tokens each) of the
base model and of each variant alone, then of all variants' batches at once, as the sweep sends them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lorarl.cli.rl as rl
import lorarl.inference.server as server
from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.inference.client import InferenceClient
from lorarl.inference.health import wait_until_healthy
from lorarl.trainer.model import apply_lora, load_model
from lorarl.variants import variant_configs

OPS = {"vLLM's": True, "lorarl's": False}  # the LoRA ops of a CPU server: stock (vLLM's) or not


def without_cpu_lora(cmd: list[str]) -> list[str]:
    """A vLLM command (or its arguments) less the cpu_lora extension: vLLM's own CPU LoRA ops."""
    at = cmd.index("--worker-extension-cls")
    assert cmd[at + 1] == server.CPU_LORA_EXTENSION, cmd
    return cmd[:at] + cmd[at + 2 :]


def rl_with_stock_ops(argv: list[str]) -> None:
    """`rl` whose vLLM servers run vLLM's own CPU LoRA ops (this script's --rl-with-stock-ops)."""
    lora_args = server.lora_args

    def stock_lora_args(adapters: server.Adapters, gpus: int, with_slots: bool = True) -> list[str]:
        return without_cpu_lora(lora_args(adapters, gpus, with_slots))

    server.lora_args = stock_lora_args  # what vllm_command calls
    rl.main(argv)


def run_rl(cfg: RLConfig, stock: bool, folder: Path) -> dict[str, float]:
    """`rl` of `cfg` in a process of its own; its figures (module docstring)."""
    path = folder / f"{cfg.run_name}.json"
    path.write_text(json.dumps(cfg.model_dump(mode="json")))
    entry = [__file__, "--rl-with-stock-ops"] if stock else ["-m", "lorarl.cli.rl"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *entry, "@", str(path)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"rl of {cfg.run_name} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"wall": wall, **step_figures(rows, cfg.max_steps)}


def step_figures(rows: list[dict[str, Any]], steps: int) -> dict[str, float]:
    """Seconds per step from the orchestrator rows' clocks (the last variant's batch of each step),
    the trainer's busy seconds per step summed over variants and the fleet's, both after step 1."""
    orchestrator = [r for r in rows if r["component"] == "orchestrator"]
    written = {s: max(r["time"] for r in orchestrator if r["step"] == s) for s in (1, steps)}
    per_step = (written[steps] - written[1]) / (steps - 1)
    trainer = [r["time/step"] - r["time/wait_for_batch"] for r in rows if r["component"] == "trainer" and r["step"] > 1]
    # The fleet is one for all variants: its busy fraction is the same in each variant's rows.
    fleet = statistics.fmean(r["inference/busy_frac"] for r in orchestrator if r["step"] > 1)
    return {"per_step": per_step, "trainer": sum(trainer) / (steps - 1), "vllm": fleet * per_step}


def benchmark_runs(cfg: RLConfig, steps: int, folder: Path) -> None:
    runs = [("sweep", cfg), *variant_configs(cfg)]
    print(f"{steps} steps of {cfg.run_name}: the sweep, then each variant alone", flush=True)
    print("| LoRA ops | run | wall s | s / step | trainer s / step | vLLM busy s / step |", flush=True)
    print("|---|---|---|---|---|---|", flush=True)
    for ops, stock in OPS.items():
        alone = []
        for name, run_cfg in runs:
            named = {"run_name": f"{name}-{'stock' if stock else 'cpu_lora'}", "max_steps": steps, "output_dir": folder}
            figures = run_rl(run_cfg.model_copy(update=named), stock, folder)
            alone += [figures] if name != "sweep" else []
            print(row(ops, name, figures), flush=True)
        print(row(ops, "variants alone, summed", {k: sum(f[k] for f in alone) for k in alone[0]}), flush=True)


def row(ops: str, name: str, f: dict[str, float]) -> str:
    return f"| {ops} | {name} | {f['wall']:.0f} | {f['per_step']:.2f} | {f['trainer']:.2f} | {f['vllm']:.2f} |"


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
            print(f"| {ops} | {name} | {statistics.median(seconds):.2f} |", flush=True)
        start = time.perf_counter()
        await asyncio.gather(*(batch_seconds(client, name, cfg, prompts) for name in adapters))
        print(f"| {ops} | all {len(adapters)} at once | {time.perf_counter() - start:.2f} |", flush=True)
    finally:
        await client.close()


def benchmark_vllm(cfg: RLConfig, folder: Path) -> None:
    adapters = {}
    for name, variant in variant_configs(cfg):
        adapters[name] = folder / name
        apply_lora(load_model(variant.model), variant.lora).save_pretrained(str(adapters[name]))
    ours = server.vllm_command(cfg, server.rl_adapters(cfg, experts=False), gpus=0)  # a CPU benchmark of dense LoRA
    print(f"--max-lora-rank {ours[ours.index('--max-lora-rank') + 1]}", flush=True)
    print("| LoRA ops | batch | s (median of 3) |\n|---|---|---|", flush=True)
    for ops, stock in OPS.items():
        serve_and_time(cfg, without_cpu_lora(ours) if stock else ours, ops, adapters, folder / f"vllm-{ops}.log")


def serve_and_time(cfg: RLConfig, cmd: list[str], ops: str, adapters: dict[str, Path], log: Path) -> None:
    """Start the server `cmd`, time its batches, stop it."""
    with log.open("w") as out:
        process = subprocess.Popen(cmd, env={**os.environ, **server.vllm_env(cfg)}, stdout=out, stderr=out)
    try:
        wait_until_healthy(server.worker_urls(cfg), cfg.inference.startup_timeout, alive=lambda: process.poll() is None)
        asyncio.run(time_batches(cfg, ops, adapters))
    finally:
        process.terminate()
        process.wait(60)


def main() -> None:
    if sys.argv[1:2] == ["--rl-with-stock-ops"]:
        return rl_with_stock_ops(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/rank_sweep/rl.toml")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--vllm", action="store_true", help="time vLLM's batches alone (module docstring)")
    args = parser.parse_args()
    cfg = load_config(RLConfig, ["@", args.config])
    with tempfile.TemporaryDirectory() as tmp:
        if args.vllm:
            benchmark_vllm(cfg, Path(tmp))
        else:
            benchmark_runs(cfg, args.steps, Path(tmp))


if __name__ == "__main__":
    main()
