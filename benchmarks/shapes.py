"""lorarl at real shapes on the CPU: what a 151,936-token vocabulary, long rows and a Qwen3-0.6B adapter cost.

Two parts, each through the real console scripts (`sft`, `rl`), one configuration per process:

`memory`: the peak resident memory and step time of `sft` (LoRA rank 8 on the 7 projections,
packing, one row of seq_len tokens, loss on every token) on a 2-layer hidden-256 Qwen3, at a
259-token vocabulary (the local tokenizer's) and at Qwen3's 151,936, with the log-probabilities
computed over the whole row at once (`logits_chunk_size` 0, lorarl before issue 33) and in chunks
(the default, or --chunks). The peak is the `sft` process's ru_maxrss (os.wait4: it cannot be
reset, hence one process per configuration); the step time is the fastest of its --steps steps
(the machine is shared). A process that passes --max-gib of resident memory is stopped, so that it
does not take the shared machine down ("> N GiB" in the table), and a whole-row configuration
whose float32 logits alone would pass it is not started ("not run").

`rl`: --steps steps of `rl` on the Qwen3-0.6B shape (random weights, built by lorarl.tiny_model --shape)
through vLLM, with completions of --max-tokens tokens (random weights never stop early), a
checkpoint every step, for each LoRA rank: the trainer's and orchestrator's step-time breakdown
(their time/* metrics), the adapter's size, its write time (trainer time/broadcast), the hand-off
latency (perf/adapter_live_s: the optimizer step's end -> the adapter loaded on every vLLM
worker), and the checkpoint's size and write time (time/checkpoint).

    flock /tmp/lorarl-heavy.lock .venv/bin/python benchmarks/shapes.py memory
    flock /tmp/lorarl-heavy.lock .venv/bin/python benchmarks/shapes.py rl

Tables and figures: docs/real_shapes.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from runner import ENV, after_warmup, cli, free_port, markdown_head, markdown_row, metrics_rows

REPO = Path(__file__).resolve().parents[1]
VOCABS = (259, 151936)
# The reference (8k) and target (32k) first, so that a cut-short run has them.
SEQ_LENS = (8192, 32768, 4096, 16384, 2048, 1024)
# The reference model for the memory table: most of its memory is the vocabulary's.
MEMORY_MODEL = {"hidden_size": 256, "num_layers": 2}


@dataclass(frozen=True)
class Measured:
    peak_gib: float | None  # None: stopped at the memory cap, or not run
    step_s: float | None
    note: str = ""

    def cell(self, cap_gib: float) -> str:
        if self.note.startswith("not run"):
            return self.note
        if self.peak_gib is None:
            return f"> {cap_gib:g} GiB (stopped)"
        if self.step_s is None:
            return f"failed ({self.note})"
        return f"{self.peak_gib:.2f} GiB, {self.step_s:.1f} s"


def flags(values: dict[str, object]) -> list[str]:
    """Command-line overrides, `--key value` for each."""
    return [arg for key, value in values.items() for arg in (f"--{key}", str(value))]


def run_capped(cmd: list[str], log: Path, cap_gib: float) -> tuple[int | None, float]:
    """Run `cmd` (its output to `log`); stop it if it and its children pass `cap_gib` resident.
    Returns (exit status or None if stopped, its peak resident GiB from os.wait4)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=REPO, start_new_session=True)
    stopped = threading.Event()

    def watch() -> None:
        parent = psutil.Process(proc.pid)
        while proc.returncode is None:
            try:
                rss = sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])
            except psutil.Error:
                return
            if rss > cap_gib * 2**30:
                stopped.set()
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    return (None if stopped.is_set() else proc.returncode), usage.ru_maxrss * 1024 / 2**30


def memory_model(root: Path, vocab: int) -> Path:
    folder = root / f"h256-L2-v{vocab}"
    if not (folder / "config.json").is_file():
        from lorarl.tiny_model import save_tiny_model

        save_tiny_model(folder, vocab_size=vocab, **MEMORY_MODEL)
    return folder


def one_row_data(root: Path, seq_len: int) -> Path:
    """One record longer than seq_len (one character = one token), which `sft` cuts to a full row."""
    path = root / f"row-{seq_len}.jsonl"
    text = "".join(chr(ord("a") + i % 26) for i in range(seq_len))
    path.write_text(json.dumps({"prompt": "copy", "completion": text}) + "\n")
    return path


def whole_row_logits_gib(seq_len: int, vocab: int) -> float:
    """What the whole-row head's float32 tensors need: 3 of [seq_len x vocab] x 4 bytes live at once
    in the backward pass (what vocab 151,936 adds to vocab 259's peak at 1k and 8k tokens, within 2%)."""
    return 3 * seq_len * vocab * 4 / 2**30


def sft_step(args: argparse.Namespace, root: Path, model: Path, vocab: int, seq_len: int, chunk: int) -> Measured:
    if chunk == 0 and (need := whole_row_logits_gib(seq_len, vocab)) > args.max_gib:
        return Measured(None, None, f"not run: would need ~{need:.0f} GiB")
    run_name = f"sft-{model.name}-{seq_len}-c{chunk}"
    data = one_row_data(root, seq_len)
    cmd = cli(
        "sft",
        *flags(
            {
                "model.name": model,
                "data.path": data,
                "data.loss_on": "all",
                "seq_len": seq_len,
                "batch_size": 1,
                "micro_batch_size": 1,
                "max_steps": args.steps,
                "log_interval": 1,
                "logits_chunk_size": chunk,
                "model.lora.rank": 8,
                "model.lora.alpha": 16,
                "output_dir": root,
                "run_name": run_name,
            }
        ),
        "--overwrite",
    )
    log = root / f"{run_name}.log"
    status, peak = run_capped(cmd, log, args.max_gib)
    if status is None:
        return Measured(None, None)
    if status != 0:
        return Measured(peak, None, f"exit {status}, see {log}")
    return Measured(peak, min(row["time/step"] for row in metrics_rows(root / run_name)))


def memory(args: argparse.Namespace) -> None:
    from lorarl.config.common import DEFAULT_LOGITS_CHUNK_SIZE

    root = args.out / "memory"
    root.mkdir(parents=True, exist_ok=True)
    chunks = args.chunks or [0, DEFAULT_LOGITS_CHUNK_SIZE]
    chunked = [c for c in chunks if c]
    models = {vocab: memory_model(root, vocab) for vocab in VOCABS}
    columns = [f"vocab {v:,}, chunk {c}" for v in VOCABS for c in chunks]
    print(markdown_head(["seq_len", *columns, *(f"peak 151,936 / 259, chunk {c}" for c in chunked)]))
    for seq_len in args.seq_lens:
        cells = {
            (vocab, chunk): sft_step(args, root, models[vocab], vocab, seq_len, chunk)
            for vocab in VOCABS
            for chunk in chunks
        }
        ratios = [ratio(cells[VOCABS[0], c].peak_gib, cells[VOCABS[1], c].peak_gib) for c in chunked]
        print(markdown_row([f"{seq_len:,}", *(m.cell(args.max_gib) for m in cells.values()), *ratios]), flush=True)


def ratio(small: float | None, large: float | None) -> str:
    return f"{large / small:.2f}x" if small and large else "-"


def rl_run(args: argparse.Namespace, model: Path, rank: int) -> Path:
    run_name = f"rl-0.6b-r{rank}"
    # micro-batches of one row: the trainer's activations for 4 x 640 tokens of the 0.6B model in float32
    # would be ~10 GiB (the memory plan's estimate), more than this machine has beside vLLM.
    cmd = cli(
        "rl",
        "@",
        str(REPO / "configs/quickstart/rl.toml"),
        *flags(
            {
                "model.name": model,
                "model.lora.rank": rank,
                "model.lora.alpha": 2 * rank,
                "max_steps": args.steps,
                "seq_len": args.max_tokens + 128,
                "orchestrator.sampling.max_tokens": args.max_tokens,
                "orchestrator.batch_size": args.prompts * args.rollouts,
                "orchestrator.rollouts_per_example": args.rollouts,
                "trainer.micro_batch_size": 1,
                "trainer.ckpt.interval": 1,
                "inference.port": free_port(),
                "inference.kv_cache_gib": 2,
                "output_dir": args.out,
                "run_name": run_name,
            }
        ),
        # Random weights earn every rollout the same reward: train on them all the same.
        "--no-orchestrator.skip_zero_advantage",
        "--overwrite",
    )
    log = args.out / f"{run_name}.log"
    # ru_maxrss here is rl's own: vLLM's engine and worker are grandchildren it does not wait for.
    status, _ = run_capped(cmd, log, args.max_gib)
    if status != 0:
        sys.exit(f"shapes: {run_name} {'passed --max-gib' if status is None else f'exited {status}'}: {log}")
    return args.out / run_name


def folder_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def rl_row(run: Path, rank: int) -> dict[str, float]:
    """The run's figures, averaged over its steps but the first (vLLM's and the trainer's warm-up)."""
    rows = metrics_rows(run)

    def series(component: str, key: str) -> list[float]:
        return after_warmup([r[key] for r in rows if r["component"] == component and key in r])

    adapter = next(iter(sorted(run.glob("broadcasts/step_*/adapter_model.safetensors"))))
    checkpoint = sorted(run.glob("checkpoints/step_*/trainer"))[-1]
    out = {"rank": rank, "adapter MiB": adapter.stat().st_size / 2**20, "checkpoint MiB": folder_mib(checkpoint)}
    for key in (
        "time/step",
        "time/wait_for_batch",
        "time/forward_backward",
        "time/optimizer",
        "time/broadcast",
        "time/checkpoint",
        "memory/peak_gib",
    ):
        out[f"trainer {key}"] = mean(series("trainer", key))
    for key in ("time/step", "tokens_per_s", "perf/adapter_live_s"):
        out[f"orchestrator {key}"] = mean(series("orchestrator", key))
    return out


def rl(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.out / "qwen3-0.6b-random"
    if not (model / "config.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "lorarl.tiny_model", str(model), "--shape", "Qwen/Qwen3-0.6B"], check=True, env=ENV
        )
    table = [rl_row(rl_run(args, model, rank), rank) for rank in args.ranks]
    keys = list(table[0])
    print(markdown_head(keys))
    for row in table:
        print(markdown_row(f"{row[k]:.2f}" if isinstance(row[k], float) else row[k] for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["memory", "rl"])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "lorarl-bench-shapes")
    parser.add_argument("--max-gib", type=float, default=16.0, help="stop a configuration past this resident memory")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(SEQ_LENS), help="memory: the row widths")
    parser.add_argument(
        "--chunks", type=int, nargs="+", help="memory: logits chunk sizes (0: whole row; default: 0 and the default)"
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64], help="rl: the LoRA ranks")
    parser.add_argument("--steps", type=int, default=3, help="steps per run")
    parser.add_argument("--prompts", type=int, default=2, help="rl: prompts per step")
    parser.add_argument("--rollouts", type=int, default=2, help="rl: rollouts per prompt")
    parser.add_argument("--max-tokens", type=int, default=512, help="rl: tokens per completion")
    args = parser.parse_args()
    memory(args) if args.part == "memory" else rl(args)


if __name__ == "__main__":
    main()
