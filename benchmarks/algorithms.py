"""What leaving zero-advantage groups out buys: `rl` runs of one config against one vLLM server.

    python benchmarks/algorithms.py @ configs/quickstart/rl.toml --steps 30

Variants, each `--steps` steps from the same starting model and example stream:

* all-groups: every group trains (`--no-orchestrator.skip_zero_advantage`: the behaviour before it)
* skip: groups whose advantages are all 0 are left out of the batch (the default now)
* cispo: skip, with `trainer.loss.type = "cispo"`

Reported from each run's metrics.jsonl: the trainer's compute seconds per step (forward/backward and
optimizer, after the first step), the rollouts it trained on per step, the share of groups with zero
advantage, steps per minute, and the mean reward after the same wall-clock time (that of the
shortest run: the last 3 steps each run had finished by then). If the model the config names is
missing and it is the quickstart's, the quickstart's preparation runs first (tiny model, warm-up
data, `sft @ configs/quickstart/sft.toml`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.inference.health import wait_until_healthy

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART_MODEL = Path("outputs/quickstart-sft/final")


def variants() -> dict[str, list[str]]:
    """Each variant's flags for `rl`."""
    return {
        "all-groups": ["--no-orchestrator.skip_zero_advantage"],
        "skip": [],
        "cispo": ["--trainer.loss.type", "cispo"],
    }


def prepare_quickstart_model(env: dict[str, str]) -> None:
    """What scripts/quickstart.sh does before `rl`: the tiny model, the warm-up data and `sft`."""
    py = sys.executable
    steps = [
        [py, "-m", "lorarl.tiny_model", "outputs/models/tiny-qwen3"],
        [py, "scripts/make_sft_data.py", "--env", "reverse_text", "--num", "4000",
         "--out", "outputs/data/reverse_text_sft.jsonl"],
        [py, "-m", "lorarl.cli.sft", "@", "configs/quickstart/sft.toml", "--overwrite", "--no-monitor.console"],
    ]  # fmt: skip
    for cmd in steps:
        print("preparing:", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def rows(run_dir: Path, component: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return sorted((r for r in map(json.loads, lines) if r["component"] == component), key=lambda r: r["step"])


def summarize(run_dir: Path, groups_per_step: int) -> dict[str, float]:
    trainer, orch = rows(run_dir, "trainer"), rows(run_dir, "orchestrator")
    start = trainer[0]["time"] - trainer[0]["time/step"]  # the trainer starts waiting for batch 1
    later = trainer[1:] or trainer  # the first step also loads and warms up
    groups = sum(groups_per_step + r["groups/extra_drawn"] for r in orch)
    return {
        "start": start,
        "wall_s": trainer[-1]["time"] - start,
        "trainer_s_per_step": statistics.fmean(r["time/forward_backward"] + r["time/optimizer"] for r in later),
        "rollouts_trained_per_step": statistics.fmean(r["rollouts/trained"] for r in orch),
        "rollouts_played_per_step": statistics.fmean(r["rollouts/trained"] + r["rollouts/skipped"] for r in orch),
        "zero_advantage_frac": sum(r["groups/zero_advantage"] for r in orch) / groups,
        "steps_per_min": 60 * len(trainer) / (trainer[-1]["time"] - start),
        "reward_first": orch[0]["reward/mean"],
    }


def reward_at(run_dir: Path, start: float, seconds: float, last: int = 3) -> float:
    """Mean reward of the last `last` steps written within `seconds` of `start`."""
    done = [r["reward/mean"] for r in rows(run_dir, "orchestrator") if r["time"] - start <= seconds + 1e-6]
    return statistics.fmean(done[-last:]) if done else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="+", help="@ file.toml ... as for rl")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--port", type=int, default=8500)
    parser.add_argument("--only", nargs="+", help="run these variants only (names as in the table)")
    args = parser.parse_args()
    cfg = load_config(RLConfig, args.config)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    if not Path(cfg.model.name).exists():
        if Path(cfg.model.name).resolve() != (ROOT / QUICKSTART_MODEL).resolve():
            sys.exit(f"model {cfg.model.name} not found")
        prepare_quickstart_model(env)
    chosen = {k: v for k, v in variants().items() if not args.only or k in args.only}
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "lorarl.cli.inference", *args.config, "--inference.port", str(args.port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip
    results: dict[str, dict[str, float]] = {}
    try:
        wait_until_healthy([url], timeout=600, alive=lambda: server.poll() is None)
        for name, flags in chosen.items():
            run_name = f"bench-algo-{name}"
            print(f"== {name}: rl {' '.join(flags)}", flush=True)
            subprocess.run(
                [sys.executable, "-m", "lorarl.cli.rl", *args.config, "--inference.urls", json.dumps([url]),
                 "--max_steps", str(args.steps), "--run_name", run_name, "--no-monitor.console",
                 "--overwrite",  # the benchmark's own runs, from an earlier invocation
                 # rl leaves vLLM its core only when it starts the workers itself.
                 "--trainer.num_threads", str(max(1, (os.cpu_count() or 1) - 1)), *flags],
                check=True, env=env,
            )  # fmt: skip
            groups_per_step = cfg.orchestrator.batch_size // cfg.orchestrator.rollouts_per_example
            results[name] = summarize(cfg.output_dir / run_name, groups_per_step)
    finally:
        os.killpg(server.pid, 15)
        server.wait()
    budget = min(r["wall_s"] for r in results.values())
    for name, r in results.items():
        r["reward_at_budget"] = reward_at(cfg.output_dir / f"bench-algo-{name}", r["start"], budget)
    print(f"\n{args.steps} steps each; reward after {budget:.0f} s, the wall time of the shortest run")
    print(f"{'variant':>11} {'trainer s/step':>15} {'trained/step':>13} {'played/step':>12} {'zero-adv':>9} "
          f"{'steps/min':>10} {'reward first':>13} {'reward @ time':>14}")  # fmt: skip
    for name, r in results.items():
        print(f"{name:>11} {r['trainer_s_per_step']:>15.2f} {r['rollouts_trained_per_step']:>13.1f} "
              f"{r['rollouts_played_per_step']:>12.1f} {r['zero_advantage_frac']:>9.0%} {r['steps_per_min']:>10.1f} "
              f"{r['reward_first']:>13.3f} {r['reward_at_budget']:>14.3f}")  # fmt: skip
    out = cfg.output_dir / "bench-algorithms.json"
    out.write_text(json.dumps({"steps": args.steps, "budget_s": budget, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
