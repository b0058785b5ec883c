"""The LoRA-for-RL results our users cite, in miniature on a CPU: RL on the quickstart's task.

python scripts/seed_experiments.py rank   # rank 1, 4, 16, 64 at alpha 64 with rsLoRA
python scripts/seed_experiments.py rank64_low_lr   # rank 64 at a tenth of the rank sweep's lr
python scripts/seed_experiments.py lr     # a learning-rate sweep at rank 8
python scripts/seed_experiments.py full   # LoRA against full-parameter RL (model.full_finetune), an lr sweep
python scripts/seed_experiments.py all --steps 60

The claims: RL learns at very low rank (rank 1 close to rank 64); rsLoRA (alpha / sqrt(rank)) keeps
gradient norms comparable across ranks; LoRA wants a learning rate about 10x full fine-tuning's.
Every variant is `rl @ configs/quickstart/rl.toml` from the quickstart's warmed-up model (its SFT
runs first if outputs/quickstart-sft/final is missing) with one setting changed and the same seed,
so the runs differ only in that setting. The script prints a table per experiment (reward of the
first and last 10 steps, mean grad norm, step time) and overlays the runs with lorarl-plot into
outputs/seed/<experiment>/.

The third claim's reference is full-parameter RL: `rl --model.full_finetune` trains every weight and
has vLLM reload the whole model after each step, so "full" sweeps its learning rate beside LoRA's.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from run_steps import BIN, REPO, ensure_local_model, run_logged

from lorarl.monitor.summary import only, summarize

WINDOW = 10
FULL = ["--model.lora", "null", "--model.full_finetune"]  # every weight trained, no adapter


def rslora(rank: int) -> list[str]:
    return ["--model.lora.rank", str(rank), "--model.lora.alpha", "64", "--model.lora.use_rslora"]


# experiment -> variant label (it names the run) -> the flags that differ from configs/quickstart/rl.toml
EXPERIMENTS: dict[str, dict[str, list[str]]] = {
    "rank": {f"rank {r}": rslora(r) for r in (1, 4, 16, 64)},
    # Rank 64 collapsed at the rank sweep's lr 2e-3: the same adapter at a tenth of it.
    "rank64_low_lr": {"rank 64, lr 2e-4": [*rslora(64), "--trainer.optim.lr", "2e-4"]},
    "lr": {f"lr {lr}": ["--trainer.optim.lr", lr] for lr in ("2e-4", "6e-4", "2e-3", "6e-3")},
    # LoRA (rank 8, alpha 32, the quickstart's) against full-parameter RL, each over lrs that reach past
    # its best: the same steps, batches and samples, so the same budget of rollouts.
    "full": {
        **{f"LoRA rank 8, lr {lr}": ["--trainer.optim.lr", lr] for lr in ("2e-4", "6e-4", "2e-3", "6e-3", "2e-2")},
        **{
            f"full fine-tuning, lr {lr}": [*FULL, "--trainer.optim.lr", lr]
            for lr in ("2e-5", "6e-5", "2e-4", "6e-4", "2e-3", "6e-3")
        },
    },
}


def run_experiment(name: str, steps: int, logs: Path) -> str:
    """Run every variant of experiment `name`; the markdown table of the results."""
    runs = []
    lines = [
        f"| {name} | reward, first {WINDOW} steps → last {WINDOW} | mean grad norm | trainer s/step |",
        "|---|---|---|---|",
    ]
    final: dict[str, float] = {}  # label -> reward of the last WINDOW steps
    for label, flags in EXPERIMENTS[name].items():
        run_name = "seed-" + re.sub(r"[^\w.-]+", "-", label.lower())  # "rank 64, lr 2e-4" -> seed-rank-64-lr-2e-4
        cmd = [str(BIN / "rl"), "@", "configs/quickstart/rl.toml", "--overwrite", "--run_name", run_name,
               "--max_steps", str(steps), *flags]  # fmt: skip
        run_logged(cmd, logs / f"{run_name}.log")
        runs.append(REPO / "outputs" / run_name)
        s = only(summarize(runs[-1], WINDOW))
        final[label] = s.reward_last
        lines.append(
            f"| {label} | {s.reward_first:.3f} → {s.reward_last:.3f} | {s.grad_norm or float('nan'):.3f} "
            f"| {s.step_time or float('nan'):.2f} |"
        )
        print(lines[-1], flush=True)
    plots = REPO / "outputs" / "seed" / name
    run_logged([str(BIN / "lorarl-plot"), *map(str, runs), "--out", str(plots)], logs / f"plot-{name}.log")
    if all(LR.search(label) for label in final):
        plot_lr_sweep(final, plots / "lr_sweep.png")
    return "\n".join(lines) + f"\n\nplots: {plots}/overview.png\n"


LR = re.compile(r"^(.*?),? ?lr (\S+)$")  # "full fine-tuning, lr 6e-4" -> ("full fine-tuning", "6e-4")


def plot_lr_sweep(final: dict[str, float], path: Path) -> None:
    """The reward of the last steps against the learning rate, a line per setting (the label before "lr")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[float, float]]] = {}
    for label, reward in final.items():
        match = LR.search(label)
        assert match is not None
        lines.setdefault(match[1] or "LoRA rank 8", []).append((float(match[2]), reward))
    fig, ax = plt.subplots(figsize=(6, 4))
    for setting, points in lines.items():
        ax.plot(*zip(*sorted(points), strict=True), marker="o", label=setting)
    ax.set(xscale="log", xlabel="learning rate", ylabel=f"reward, mean of the last {WINDOW} steps")
    ax.set_title("Reward after the same steps, by learning rate")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    parser.add_argument("--steps", type=int, default=60, help="RL steps of every variant")
    parser.add_argument("--logs", type=Path, default=REPO / "outputs" / "seed", help="where logs go")
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    ensure_local_model(args.logs)
    if not (REPO / "outputs/quickstart-sft/final/config.json").exists():
        if not (REPO / "outputs/data/reverse_text_sft.jsonl").exists():
            run_logged([sys.executable, "scripts/make_sft_data.py", "--env", "reverse_text", "--num", "4000",
                        "--out", "outputs/data/reverse_text_sft.jsonl"], args.logs / "data.log")  # fmt: skip
        run_logged([str(BIN / "sft"), "@", "configs/quickstart/sft.toml", "--overwrite"], args.logs / "sft.log")
    tables = [
        run_experiment(name, args.steps, args.logs)
        for name in (EXPERIMENTS if args.experiment == "all" else [args.experiment])
    ]
    print("\n" + "\n".join(tables))


if __name__ == "__main__":
    main()
