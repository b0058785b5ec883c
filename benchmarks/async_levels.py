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

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from runner import inference_server, markdown_head, markdown_row, rl_against, rl_summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="+", help="@ file.toml ... as for rl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--continuous", action="store_true", help="max_off_policy_steps = max_async_level")
    args = parser.parse_args()
    cfg = load_config(RLConfig, args.config)
    results = {}
    with inference_server(args.config, args.port, ["--orchestrator.max_async_level", str(max(args.levels))]) as url:
        for level in args.levels:
            name = f"bench-async-{level}" + ("-continuous" if args.continuous else "")
            continuous = ["--orchestrator.max_off_policy_steps", str(level)] if args.continuous else []
            rl_against(url, args.config, name, args.steps, ["--orchestrator.max_async_level", str(level), *continuous])
            results[level] = rl_summary(cfg.output_dir / name)
    print("\n" + markdown_head(["max_async_level", "steps/min", "trainer idle", "inference busy", "lag", "dropped"]))
    for level, r in results.items():
        cells = [level, f"{r['steps_per_min']:.1f}", f"{r['trainer_idle_frac']:.0%}", f"{r['inference_busy_frac']:.0%}"]
        print(markdown_row([*cells, f"{r['policy_lag_mean']:.2f}", r["dropped_groups"]]))
    out = cfg.output_dir / ("bench-async-continuous.json" if args.continuous else "bench-async.json")
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
