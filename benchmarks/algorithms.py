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
import statistics
import subprocess
import sys
from pathlib import Path

from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from runner import ENV, cli, inference_server, markdown_head, markdown_row, metrics_rows, rl_against, steady_rows

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART_MODEL = Path("outputs/quickstart-sft/final")


def variants() -> dict[str, list[str]]:
    """Each variant's flags for `rl`."""
    return {
        "all-groups": ["--no-orchestrator.skip_zero_advantage"],
        "skip": [],
        "cispo": ["--trainer.loss.type", "cispo"],
    }


def prepare_quickstart_model() -> None:
    """What scripts/quickstart.sh does before `rl`: the tiny model, the warm-up data and `sft`."""
    steps = [
        [sys.executable, "-m", "lorarl.tiny_model", "outputs/models/tiny-qwen3"],
        [sys.executable, "scripts/make_sft_data.py", "--env", "reverse_text", "--num", "4000",
         "--out", "outputs/data/reverse_text_sft.jsonl"],
        cli("sft", "@", "configs/quickstart/sft.toml", "--overwrite", "--no-monitor.console"),
    ]  # fmt: skip
    for cmd in steps:
        print("preparing:", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, env=ENV, cwd=ROOT)


def summarize(run_dir: Path, groups_per_step: int) -> dict[str, float]:
    trainer, orch = metrics_rows(run_dir, "trainer"), metrics_rows(run_dir, "orchestrator")
    start = trainer[0]["time"] - trainer[0]["time/step"]  # the trainer starts waiting for batch 1
    later = steady_rows(trainer)  # the first step also loads and warms up
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
    done = [r["reward/mean"] for r in metrics_rows(run_dir, "orchestrator") if r["time"] - start <= seconds + 1e-6]
    return statistics.fmean(done[-last:]) if done else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="+", help="@ file.toml ... as for rl")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--port", type=int, default=8500)
    parser.add_argument("--only", nargs="+", help="run these variants only (names as in the table)")
    args = parser.parse_args()
    cfg = load_config(RLConfig, args.config)
    if not Path(cfg.model.name).exists():
        if Path(cfg.model.name).resolve() != (ROOT / QUICKSTART_MODEL).resolve():
            sys.exit(f"model {cfg.model.name} not found")
        prepare_quickstart_model()
    chosen = {k: v for k, v in variants().items() if not args.only or k in args.only}
    groups_per_step = cfg.orchestrator.batch_size // cfg.orchestrator.rollouts_per_example
    results: dict[str, dict[str, float]] = {}
    with inference_server(args.config, args.port) as url:
        for name, flags in chosen.items():
            print(f"== {name}: rl {' '.join(flags)}", flush=True)
            rl_against(url, args.config, f"bench-algo-{name}", args.steps, flags)
            results[name] = summarize(cfg.output_dir / f"bench-algo-{name}", groups_per_step)
    budget = min(r["wall_s"] for r in results.values())
    for name, r in results.items():
        r["reward_at_budget"] = reward_at(cfg.output_dir / f"bench-algo-{name}", r["start"], budget)
    print(f"\n{args.steps} steps each; reward after {budget:.0f} s, the wall time of the shortest run")
    print(markdown_head(["variant", "trainer s/step", "trained/step", "played/step", "zero-adv", "steps/min",
                         "reward first", "reward @ time"]))  # fmt: skip
    for name, r in results.items():
        print(markdown_row([name, f"{r['trainer_s_per_step']:.2f}", f"{r['rollouts_trained_per_step']:.1f}",
                            f"{r['rollouts_played_per_step']:.1f}", f"{r['zero_advantage_frac']:.0%}",
                            f"{r['steps_per_min']:.1f}", f"{r['reward_first']:.3f}",
                            f"{r['reward_at_budget']:.3f}"]))  # fmt: skip
    out = cfg.output_dir / "bench-algorithms.json"
    out.write_text(json.dumps({"steps": args.steps, "budget_s": budget, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
