"""Throughput of `rl` at several `max_async_level`s on one config and one vLLM server.

    python benchmarks/async_levels.py @ configs/quickstart/rl.toml --steps 20 --levels 0 1 2 [--continuous]

Reports, per level, from metrics.jsonl (steps after the first, so start-up is not counted):
steps per minute, the trainer's idle fraction (time waiting for a batch / wall time), the
inference busy fraction (time with requests in flight / wall time, averaged over workers), the
mean policy lag and the groups dropped. `--continuous` runs each level with continuous batching
and the same lag bound (max_off_policy_steps = max_async_level).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.inference.health import wait_until_healthy


def summarize(run_dir: Path, warmup: int = 1) -> dict[str, float]:
    """A run's steady state: its steps after the first `warmup`."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trainer = sorted((r for r in rows if r["component"] == "trainer"), key=lambda r: r["step"])[warmup:]
    orch = sorted((r for r in rows if r["component"] == "orchestrator"), key=lambda r: r["step"])[warmup:]
    wall = trainer[-1]["time"] - trainer[0]["time"] + trainer[0]["time/step"]
    return {
        "steps_per_min": 60 * len(trainer) / wall,
        "trainer_idle_frac": sum(r["time/wait_for_batch"] for r in trainer) / wall,
        "inference_busy_frac": statistics.fmean(r["inference/busy_frac"] for r in orch),
        "policy_lag_mean": statistics.fmean(r["policy_lag/mean"] for r in trainer),
        "reward_last": statistics.fmean(r["reward/mean"] for r in orch[-5:]),
        "dropped_groups": sum(r["dropped/groups"] for r in orch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="+", help="@ file.toml ... as for rl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--continuous", action="store_true", help="max_off_policy_steps = max_async_level")
    args = parser.parse_args()
    cfg = load_config(RLConfig, args.config)
    url = f"http://127.0.0.1:{args.port}"
    server_flags = ["--inference.port", str(args.port), "--orchestrator.max_async_level", str(max(args.levels))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    server = subprocess.Popen(
        [sys.executable, "-m", "lorarl.cli.inference", *args.config, *server_flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip
    results = {}
    try:
        wait_until_healthy([url], timeout=600, alive=lambda: server.poll() is None)
        for level in args.levels:
            name = f"bench-async-{level}" + ("-continuous" if args.continuous else "")
            continuous = ["--orchestrator.max_off_policy_steps", str(level)] if args.continuous else []
            subprocess.run(
                [sys.executable, "-m", "lorarl.cli.rl", *args.config, "--inference.urls", json.dumps([url]),
                 "--orchestrator.max_async_level", str(level), "--max_steps", str(args.steps), "--run_name", name,
                 "--overwrite",  # the benchmark's own runs, from an earlier invocation
                 *continuous,
                 # rl leaves vLLM its core only when it starts the workers itself.
                 "--trainer.num_threads", str(max(1, (os.cpu_count() or 1) - 1))],
                check=True, env=env,
            )  # fmt: skip
            results[level] = summarize(cfg.output_dir / name)
    finally:
        os.killpg(server.pid, 15)
        server.wait()
    print(f"\n{'max_async_level':>15} {'steps/min':>10} {'trainer idle':>13} {'inference busy':>15} {'lag':>5} "
          f"{'dropped':>8}")  # fmt: skip
    for level, r in results.items():
        print(f"{level:>15} {r['steps_per_min']:>10.1f} {r['trainer_idle_frac']:>13.0%} "
              f"{r['inference_busy_frac']:>15.0%} {r['policy_lag_mean']:>5.2f} {r['dropped_groups']:>8}")  # fmt: skip
    out = cfg.output_dir / ("bench-async-continuous.json" if args.continuous else "bench-async.json")
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
