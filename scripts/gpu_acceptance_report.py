"""The figures of one scripts/gpu_acceptance.sh run, from its run folder and its nvidia-smi log.

Per step: the trainer's and the orchestrator's step time, tokens/s (the trainer's loss tokens, the
orchestrator's completion tokens), the on-policy gap between the trainer's and vLLM's logprobs
(mismatch/logprob_abs_diff, max_async_level 0), the adapter's write time (time/broadcast), the
hand-off latency (perf/adapter_live_s: the optimizer step's end -> the adapter live on every vLLM
worker), the checkpoint's write time and the trainer's peak memory; the adapter's size. Then
each process's peak memory against the memory plan (configs/memory_plan.txt, written by `rl`): the
trainer's torch peak (memory/peak_gib) and, from nvidia-smi, what each process and each GPU held at
most (CUDA contexts and vLLM's KV cache included).

    python scripts/gpu_acceptance_report.py RUN_DIR NVIDIA_SMI_LOG [--steps N]

Exit status 1 when the run did not log the trainer's steps 1..N.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

from lorarl.monitor.plots import metrics_file, read_metrics

# A process's line of memory_plan.txt: "trainer      gpu 0    54.4 GiB  97.3 GiB   weights ...".
PLAN_LINE = re.compile(r"^(?P<process>inference-\d+|trainer\S*)\s.*?\s(?P<gib>\d+(?:\.\d+)?) GiB\s")
MIB_PER_GIB = 1024


def metric_rows(run: Path) -> list[dict]:
    """The run's metrics rows; none when it wrote no metrics.jsonl (it stopped before its first step)."""
    return read_metrics(run) if metrics_file(run).exists() else []


def plan_estimates(run: Path) -> dict[str, float]:
    """The memory plan's estimate (GiB) per process, by its name in the placement."""
    path = run / "configs" / "memory_plan.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return {m["process"]: float(m["gib"]) for line in lines if (m := PLAN_LINE.match(line))}


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def step_table(rows: list[dict]) -> list[str]:
    trainer = sorted((r for r in rows if r.get("component") == "trainer"), key=lambda r: r["step"])
    orch = {r["step"]: r for r in rows if r.get("component") == "orchestrator"}
    out = [
        f"{'step':>4}  {'trainer s':>9}  {'trainer tok/s':>13}  {'orch s':>7}  {'orch tok/s':>10}  "
        f"{'|logprob gap|':>13}  {'write s':>7}  {'hand-off s':>10}  {'ckpt s':>6}  {'trainer peak GiB':>16}"
    ]
    for r in trainer:
        o = orch.get(r["step"], {})
        out.append(
            f"{r['step']:>4}  {fmt(r.get('time/step'), '.2f'):>9}  {fmt(r.get('tokens_per_s'), ',.0f'):>13}  "
            f"{fmt(o.get('time/step'), '.2f'):>7}  {fmt(o.get('tokens_per_s'), ',.0f'):>10}  "
            f"{fmt(r.get('mismatch/logprob_abs_diff'), '.2e'):>13}  {fmt(r.get('time/broadcast'), '.2f'):>7}  "
            f"{fmt(o.get('perf/adapter_live_s'), '.2f'):>10}  {fmt(r.get('time/checkpoint'), '.2f'):>6}  "
            f"{fmt(r.get('memory/peak_gib'), '.2f'):>16}"
        )
    return out


def smi_peaks(smi: Path) -> tuple[dict[str, tuple[int, str]], dict[str, int]]:
    """Per process (pid -> (peak MiB, command)) and per GPU (index -> peak MiB) from the poller's log."""
    procs: dict[str, tuple[int, str]] = {}
    per_gpu: dict[str, int] = defaultdict(int)
    for line in smi.read_text().splitlines() if smi.exists() else []:
        kind, key, mem, cmd = (line.split(" ", 3) + ["", "", ""])[:4]
        if not mem.isdigit():
            continue
        if kind == "proc":
            procs[key] = (max(int(mem), procs.get(key, (0, ""))[0]), cmd)
        elif kind == "gpu":
            per_gpu[key] = max(per_gpu[key], int(mem))
    return procs, per_gpu


def process_kind(cmd: str) -> str:
    if "lorarl.cli.trainer" in cmd:
        return "trainer"
    return "vLLM" if "vllm" in cmd.lower() or cmd in ("", "?") else "other"


def memory_table(rows: list[dict], plan: dict[str, float], smi: Path) -> list[str]:
    trainer_peak = max((r["memory/peak_gib"] for r in rows if r.get("component") == "trainer"), default=None)
    procs, per_gpu = smi_peaks(smi)
    out = ["process       plan GiB  measured GiB  source"]
    by_kind: dict[str, list[int]] = defaultdict(list)
    for mem, cmd in procs.values():
        by_kind[process_kind(cmd)].append(mem)
    for name, estimate in plan.items():
        kind = "trainer" if name.startswith("trainer") else "vLLM"
        smi_gib = max(by_kind[kind], default=None)
        out.append(
            f"{name:<12}  {estimate:>8.1f}  {fmt(None if smi_gib is None else smi_gib / MIB_PER_GIB, '.1f'):>12}"
            f"  nvidia-smi (largest {kind} process)"
        )
        if kind == "trainer":
            out.append(f"{'':<12}  {'':>8}  {fmt(trainer_peak, '.1f'):>12}  torch's peak allocation (memory/peak_gib)")
    if not procs:
        out.append("(nvidia-smi listed no processes, e.g. in a container: see the per-GPU peaks)")
    total = sum(plan.values())
    for index, mib in sorted(per_gpu.items()):
        out.append(
            f"gpu {index}: {mib / MIB_PER_GIB:.1f} GiB used at most (every process on it); the plan's "
            f"processes together {total:.1f} GiB"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("smi_log", type=Path)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    rows = metric_rows(args.run)
    adapters = sorted(args.run.glob("broadcasts/step_*/adapter_model.safetensors"))
    size = f"adapter {adapters[-1].stat().st_size / 2**20:.1f} MiB" if adapters else "no adapter found"
    print(
        "\n".join(
            [
                f"== per step ({size})",
                *step_table(rows),
                "== peak memory against the plan",
                *memory_table(rows, plan_estimates(args.run), args.smi_log),
            ]
        )
    )
    steps = sorted(r["step"] for r in rows if r.get("component") == "trainer")
    if steps != list(range(1, args.steps + 1)):
        sys.exit(f"gpu_acceptance: expected trainer steps 1-{args.steps} in {args.run}/metrics.jsonl, got {steps}")


if __name__ == "__main__":
    main()
