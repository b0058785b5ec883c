"""Summarize an RL run from its metrics.jsonl: reward at the start and end, time per step.

python scripts/summarize_run.py outputs/quickstart-rl [--window 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--window", type=int, default=5)
    args = parser.parse_args()
    rows = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines()]
    orch = sorted((r for r in rows if r["component"] == "orchestrator"), key=lambda r: r["step"])
    trainer = [r for r in rows if r["component"] == "trainer"]
    rewards = [r["reward/mean"] for r in orch]
    w = args.window
    print(f"run: {args.run_dir} ({len(orch)} steps)")
    print(f"mean reward, first {w} steps: {statistics.fmean(rewards[:w]):.3f}")
    print(f"mean reward, last {w} steps:  {statistics.fmean(rewards[-w:]):.3f}")
    print(f"trainer step time (median): {statistics.median(r['time/step'] for r in trainer):.2f} s")
    # A step with an empty batch (all groups had zero advantage) has no lag and no mismatch.
    diffs = [r["mismatch/logprob_abs_diff"] for r in trainer if r.get("policy_lag/max") == 0]
    if diffs:
        print(f"on-policy |trainer - vLLM| logprob (max over steps): {max(diffs):.2e}")


if __name__ == "__main__":
    main()
