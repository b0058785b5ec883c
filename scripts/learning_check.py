"""Does every shipped recipe learn? Run them and print the evidence, a row per environment.

python scripts/learning_check.py                      # every recipe
python scripts/learning_check.py alphabet_sort math   # some
python scripts/learning_check.py math --keep-warmup   # rl.toml again, from the warm-up already there
python scripts/learning_check.py calculator --control # and the warm-up policy on the same examples

A recipe is a folder of configs/ or examples/ with an `sft.toml` (a supervised warm-up of the tiny local model on
reference episodes, standing in for the pretraining a real base model has) and an `rl.toml` that
starts from its output. A warm-up may come in stages: where sft.toml's model is the result of another
`sft*.toml` of the folder (configs/calculator/sft_copy.toml), that one runs first. For each recipe
this script builds the tiny model and the warm-up data if they are missing (the data with the exact
environment args of rl.toml), runs each `sft` stage, then `rl`, all with --overwrite (their runs are
the recipes' own folders under outputs/), and reads metrics.jsonl:
the mean reward of the first and last 10 steps, evals (avg@k, pass@k) of the starting and the final
policy, and wall times. The markdown table it prints is the table of docs/learning.md.

--control runs rl.toml a second time with lr 1e-12 (run `<run_name>-control`): the warm-up policy,
unchanged, on the same example stream. Where the reward depends much on the example, the first and
last 10 steps differ without any learning; the row beside it tells how much.

A benchmark to rerun by hand, not a test: it takes tens of minutes on a laptop CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from run_steps import BIN, REPO, ensure_local_model, run_logged

from lorarl.monitor.summary import RunSummary, only, summarize

WINDOW = 10
CONTROL_LR = "1e-12"  # the adapter moves by ~1e-12: the warm-up's policy, through the same loop
# Warm-up data flags beyond the environment's own args, per warm-up config (each one's header shows its command).
DATA_FLAGS = {"search/sft.toml": ["--guess-frac", "0.3"], "calculator/sft_copy.toml": ["--no-tools"]}


@dataclass
class Result:
    recipe: str
    sft_s: float
    rl_s: float
    run: RunSummary


def recipes() -> list[str]:
    return sorted(folder.name for folder in recipe_folders())


def recipe_folders() -> list[Path]:
    rl_configs = [*REPO.glob("configs/*/rl.toml"), *REPO.glob("examples/*/rl.toml")]
    return [p.parent for p in rl_configs if (p.parent / "sft.toml").exists()]


def folder(recipe: str) -> Path:
    """The recipe's folder: configs/<recipe> or examples/<recipe>."""
    (found,) = [f for f in recipe_folders() if f.name == recipe]
    return found


def read_toml(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def final_model(config: dict[str, Any]) -> str:
    """Where a run of `config` writes its result, as a config's [model] name would point to it."""
    return f"{config.get('output_dir', 'outputs')}/{config['run_name']}/final"


def warmup_stages(folder: Path) -> list[Path]:
    """The recipe's `sft*.toml` in the order they run: sft.toml last, each stage after the one whose
    result its [model] name is."""
    made_by = {final_model(read_toml(p)): p for p in folder.glob("sft*.toml")}
    stages = [folder / "sft.toml"]
    while (before := made_by.get(read_toml(stages[0])["model"]["name"])) and before not in stages:
        stages.insert(0, before)
    return stages


def make_data(stage: Path, sft: dict[str, Any], rl: dict[str, Any], logs: Path) -> None:
    """The warm-up data of a stage's data.path, drawn with rl.toml's environment and args: at least
    an epoch of the stage, so that it sees each example about once."""
    path = REPO / sft["data"]["path"]
    if path.exists():
        return
    (env,) = rl["orchestrator"]["env"]
    cmd = [sys.executable, "scripts/make_sft_data.py", "--env", env["id"], "--args", json.dumps(env.get("args", {})),
           "--num", str(max(4000, sft["max_steps"] * sft["batch_size"])), "--out", str(path),
           *DATA_FLAGS.get(f"{stage.parent.name}/{stage.name}", [])]  # fmt: skip
    run_logged(cmd, logs / f"data-{path.stem}.log")


def warm_up(folder: Path, rl: dict[str, Any], logs: Path) -> float:
    """Run the recipe's warm-up, stage by stage, as a user would; its wall time in seconds."""
    seconds = 0.0
    for stage in warmup_stages(folder):
        sft = read_toml(stage)
        ensure_local_model(logs, sft["model"]["name"])
        make_data(stage, sft, rl, logs)
        sft_cmd = [str(BIN / "sft"), "@", str(stage.relative_to(REPO)), "--overwrite"]
        seconds += run_logged(sft_cmd, logs / f"{folder.name}-{stage.stem}.log")
    return seconds


def check(recipe: str, logs: Path, keep_warmup: bool, control: bool) -> list[Result]:
    """The recipe's row, and with `control` the row of its run at CONTROL_LR."""
    rl_toml = folder(recipe) / "rl.toml"
    rl = read_toml(rl_toml)
    warmed_up = (REPO / rl["model"]["name"] / "config.json").exists()
    sft_s = 0.0 if keep_warmup and warmed_up else warm_up(rl_toml.parent, rl, logs)
    rl_cmd = [str(BIN / "rl"), "@", str(rl_toml.relative_to(REPO)), "--overwrite"]
    rl_s = run_logged(rl_cmd, logs / f"{recipe}-rl.log")
    results = [Result(recipe, sft_s, rl_s, only(summarize(REPO / rl["output_dir"] / rl["run_name"], WINDOW)))]
    if control:
        name = f"{rl['run_name']}-control"
        control_s = run_logged([*rl_cmd, "--run-name", name, "--trainer.optim.lr", CONTROL_LR], logs / f"{name}.log")
        run = only(summarize(REPO / rl["output_dir"] / name, WINDOW))
        results.append(Result(f"{recipe}, control (lr {CONTROL_LR})", 0.0, control_s, run))
    return results


def table(results: list[Result]) -> str:
    lines = [
        f"| recipe | reward, first {WINDOW} steps → last {WINDOW} | eval avg@k start → end "
        "| eval pass@k start → end | RL steps | RL wall time | SFT warm-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.recipe} | {r.run.reward_first:.3f} → {r.run.reward_last:.3f} | {r.run.eval_change('avg@')} "
            f"| {r.run.eval_change('pass@')} | {r.run.steps} | {r.rl_s / 60:.1f} min "
            f"| {f'{r.sft_s / 60:.1f} min' if r.sft_s else 'kept'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "recipe", nargs="*", help=f"folders of configs/ or examples/ (default: all of {', '.join(recipes())})"
    )
    parser.add_argument("--logs", type=Path, default=REPO / "outputs" / "learning_check", help="where logs go")
    parser.add_argument(
        "--keep-warmup", action="store_true", help="reuse a recipe's warmed-up model if it is there (to tune rl.toml)"
    )
    parser.add_argument("--control", action="store_true", help=f"also run each rl.toml at lr {CONTROL_LR}")
    args = parser.parse_args()
    unknown = sorted(set(args.recipe) - set(recipes()))
    if unknown:
        parser.error(f"no recipe {', '.join(unknown)}: the recipes are {', '.join(recipes())}")
    args.logs.mkdir(parents=True, exist_ok=True)
    # The examples' environments (`examples.<folder>.<module>:<factory>`) import from the repository
    # root, for make_sft_data.py as `rl` makes them for its orchestrator.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    results: list[Result] = []
    for recipe in args.recipe or recipes():
        rows = check(recipe, args.logs, args.keep_warmup, args.control)
        print(table(rows), flush=True)
        results += rows
    print("\n" + table(results))
    (args.logs / "table.md").write_text(table(results) + "\n")


if __name__ == "__main__":
    main()
