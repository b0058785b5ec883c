"""Summarize an RL run from its metrics.jsonl: reward at the start and end, evals, time per step.

python scripts/summarize_run.py outputs/quickstart-rl [--window 5]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lorarl.monitor.summary import summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--window", type=int, default=5)
    args = parser.parse_args()
    w = args.window
    for label, run in summarize(args.run_dir, args.window).items():
        print(f"run: {label} ({run.steps} steps)")
        print(f"mean reward, first {w} steps: {run.reward_first:.3f}")
        print(f"mean reward, last {w} steps:  {run.reward_last:.3f}")
        if run.evals:
            print(f"evals, first → last policy: avg {run.eval_change('avg@')}; pass {run.eval_change('pass@')}")
        if run.step_time is not None:
            print(f"trainer step time (median): {run.step_time:.2f} s")
        if run.on_policy_mismatch is not None:
            print(f"on-policy |trainer - vLLM| logprob (max over steps): {run.on_policy_mismatch:.2e}")


if __name__ == "__main__":
    main()
