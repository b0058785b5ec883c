"""Bad input of one class: a link (symbolic, or hard) planted where lorarl writes, records or removes (a run
folder's configs/, logs/, checkpoints/, final/, plots/, a file in them, its record or its lock; a
`lorarl-merge --out` or `lorarl-plot --out`). lorarl never makes a link, so each one leads to someone
else's files: every command that would write, clear or move through it refuses it in one line naming
it, and the user's files behind it keep their bytes (`bad_inputs.assert_refused`, and `user_bytes`).
A record that is a folder is refused the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from lorarl.run_folder import RunFolder
from lorarl.written_files import MANIFEST, RECORD, record
from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, merge_args

ROW = json.dumps({"step": 1, "component": "trainer", "loss": 0.5})


def links(w: Workspace) -> Path:
    """This file's part of the workspace (`planted` makes it)."""
    return w.root / "links"


def user_bytes(w: Workspace) -> dict[str, bytes]:
    """The bytes of every file in the user's folders that the links lead to."""
    return {str(p): p.read_bytes() for folder in (w.user, links(w) / "user") for p in folder.rglob("*") if p.is_file()}


def finished_run(w: Workspace, name: str, kind: str = "rl") -> RunFolder:
    """A finished run of `kind` (marker, record, configs, logs, a checkpoint of step 2, metrics, final)."""
    run = RunFolder(links(w) / "runs" / name)
    run.prepare(kind, {}, resume=False, overwrite=False)
    run.create()
    run.write_checkpoint_half(2, "trainer", lambda d: (d / "state.json").write_text('{"step": 2}'))
    for path in (
        run.configs / "trainer.json",
        run.logs / "trainer.log",
        run.metrics,
        run.final / "adapter_config.json",
    ):
        path.parent.mkdir(exist_ok=True)
        path.write_text(ROW + "\n")
        record(run.root, [path])
    return run


def plant(run: RunFolder, place: str, target: Path) -> None:
    """A link at `place` in `run` to `target`, in place of what lorarl wrote there."""
    path = run.root / place
    if path.is_dir() and not path.is_symlink():
        for p in sorted(path.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        path.rmdir()
    elif path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def plant_hard(run: RunFolder, place: str, target: Path) -> None:
    """A hard link at `place` in `run`: the user's file `target` under lorarl's name for its own."""
    path = run.root / place
    path.unlink()
    path.hardlink_to(target)


# run folder name -> (kind, the entry that becomes a link, what it leads to: a user's "folder" or "file").
PLANTED = {
    "configs-to-folder": ("rl", "configs", "folder"),
    "logs-to-folder": ("rl", "logs", "folder"),
    "config-to-file": ("rl", "configs/trainer.json", "file"),
    "log-to-file": ("rl", "logs/trainer.log", "file"),
    "record-to-file": ("rl", RECORD, "file"),
    "marker-to-file": ("rl", "run.json", "file"),
    "lock-to-file": ("rl", ".lock", "file"),
    "metrics-to-file": ("rl", "metrics.jsonl", "file"),
    "checkpoints-to-folder": ("rl", "checkpoints", "folder"),
    "state-to-file": ("rl", "checkpoints/step_2/trainer/state.json", "file"),
    "rollouts-to-folder": ("rl", "rollouts/step_1", "folder"),
    "plots-to-folder": ("rl", "plots", "folder"),
    "sft-final-to-folder": ("sft", "final", "folder"),
    "sft-logs-to-folder": ("sft", "logs", "folder"),
    "sft-record-to-file": ("sft", RECORD, "file"),
    # Third pass (issue 49): other entries, other targets.
    "samples-to-folder": ("rl", "samples", "folder"),
    "broadcasts-to-folder": ("rl", "broadcasts", "folder"),
    "final-to-folder": ("rl", "final", "folder"),
    "commands-to-file": ("rl", "configs/commands.txt", "file"),
    "orch-log-to-file": ("rl", "logs/orchestrator.log", "file"),
    "step-to-folder": ("rl", "checkpoints/step_2", "folder"),
    "record-to-folder": ("rl", RECORD, "folder"),
    "dangling-config": ("rl", "configs/orchestrator.json", "nowhere"),
    "sft-configs-to-folder": ("sft", "configs", "folder"),
    "sft-metrics-to-file": ("sft", "metrics.jsonl", "file"),
    "sft-lock-to-file": ("sft", ".lock", "file"),
    # A checkpoint that is a link, named as one by a resume (not taken for a missing checkpoint).
    "sft-step-to-folder": ("sft", "checkpoints/step_2", "folder"),
    "half-to-folder": ("rl", "checkpoints/step_2/trainer", "folder"),
}
# run folder name -> (kind, the file that becomes a hard link to the user's file): written in place, it
# would change the user's file.
HARD = {
    "config-hard": ("rl", "configs/trainer.json"),
    "log-hard": ("sft", "logs/trainer.log"),
    "record-hard": ("rl", RECORD),
    "metrics-hard": ("rl", "metrics.jsonl"),
}


@pytest.fixture(scope="module", autouse=True)
def planted(ws: Workspace) -> None:
    user = links(ws) / "user"  # a user's folder with a file named as lorarl names its own
    user.mkdir(parents=True)
    for name in ("trainer.json", "trainer.log", "overview.png", "config.json", "adapter_config.json"):
        (user / name).write_text(f"the user's {name}\n" * 40)
    targets = {"folder": user, "file": ws.user / "chapter1.tex", "nowhere": links(ws) / "user" / "not-yet"}
    for name, (kind, place, target) in PLANTED.items():
        plant(finished_run(ws, name, kind), place, targets[target])
    for name, (kind, place) in HARD.items():
        plant_hard(finished_run(ws, name, kind), place, ws.user / "chapter1.tex")
    folder_record = finished_run(ws, "record-is-folder")  # a record that is a folder, not a file
    (folder_record.root / RECORD).unlink()
    (folder_record.root / RECORD / "x").mkdir(parents=True)
    merged = links(ws) / "merged"  # an earlier merge output (manifest, marker) with a user's file
    merged.mkdir()
    (merged / "lorarl-merge.json").write_text("{}")
    (merged / MANIFEST).write_text(json.dumps({"lorarl-merge.json": 2}))
    (merged / "NOTES.md").write_text("the user's notes")
    (links(ws) / "latest-merge").symlink_to(merged)
    (links(ws) / "empty").mkdir()
    (links(ws) / "to-empty").symlink_to(links(ws) / "empty")
    (links(ws) / "figures").symlink_to(user)
    plotted = links(ws) / "plotted"  # a plot folder of lorarl-plot's, its record a link to a user's file
    plotted.mkdir()
    (plotted / RECORD).symlink_to(ws.user / "chapter1.tex")
    (links(ws) / "metrics.jsonl").write_text(ROW + "\n")
    (links(ws) / "dangling").symlink_to(links(ws) / "not-there")  # a link to what is not (yet) there
    (links(ws) / "relative").symlink_to("user")  # a relative link, to the user's folder beside it


def in_run(name: str, *more: str, kind: str = "rl") -> Callable[[Workspace], list[str]]:
    """`rl` or `sft` args on the planted run folder `name` (rl: a dry run)."""

    def args(w: Workspace) -> list[str]:
        base = ["--model.name", str(w.model), "--output_dir", str(links(w) / "runs"), "--run_name", name, *more]
        return [*base, "--dry-run"] if kind == "rl" else [*base, "--data.path", str(w.data)]

    return args


def alone(name: str) -> Callable[[Workspace], list[str]]:
    """`lorarl-trainer` or `lorarl-orchestrator` args, run alone on the planted run folder `name`."""
    return lambda w: ["--model.name", str(w.model), "--output_dir", str(links(w) / "runs"), "--run_name", name]


def plot_into(out: str | None, run: str = "") -> Callable[[Workspace], list[str]]:
    """`lorarl-plot` of the links' metrics (or of run folder `run`), into `out` under this file's folder."""

    def args(w: Workspace) -> list[str]:
        source = links(w) / "runs" / run if run else links(w) / "metrics.jsonl"
        return [str(source), *(["--out", str(links(w) / out)] if out else [])]

    return args


def merge_into(out: str, *more: str) -> Callable[[Workspace], list[str]]:
    return lambda w: merge_args("{w.model}", "{w.adapter}", str(links(w) / out), *more)(w)


IS_LINK = "is a symbolic link, which lorarl did not make"
IS_HARD = "is a hard link (one file with another name elsewhere), which lorarl did not make"
CASES: list[Case] = [
    # rl, dry runs included: a link anywhere it writes, clears or records.
    ("rl", in_run("configs-to-folder", "--overwrite"), f"configs-to-folder/configs {IS_LINK}"),
    ("rl", in_run("configs-to-folder", "--resume"), f"configs-to-folder/configs {IS_LINK}"),
    ("rl", in_run("logs-to-folder", "--overwrite"), f"logs-to-folder/logs {IS_LINK}"),
    ("rl", in_run("config-to-file", "--overwrite"), f"configs/trainer.json {IS_LINK}"),
    ("rl", in_run("log-to-file", "--overwrite"), f"logs/trainer.log {IS_LINK}"),
    ("rl", in_run("record-to-file", "--overwrite"), f"record-to-file/{RECORD} {IS_LINK}"),
    ("rl", in_run("record-to-file", "--resume"), f"record-to-file/{RECORD} {IS_LINK}"),
    ("rl", in_run("record-is-folder", "--overwrite"), f"{RECORD} is a folder, not lorarl's record"),
    ("rl", in_run("marker-to-file", "--overwrite"), f"marker-to-file/run.json {IS_LINK}"),
    ("rl", in_run("lock-to-file", "--overwrite"), f"lock-to-file/.lock {IS_LINK}"),
    ("rl", in_run("metrics-to-file", "--overwrite"), f"metrics-to-file/metrics.jsonl {IS_LINK}"),
    ("rl", in_run("checkpoints-to-folder", "--overwrite"), f"checkpoints-to-folder/checkpoints {IS_LINK}"),
    ("rl", in_run("state-to-file", "--overwrite"), f"step_2/trainer/state.json {IS_LINK}"),
    ("rl", in_run("rollouts-to-folder", "--overwrite"), f"rollouts/step_1 {IS_LINK}"),
    ("rl", in_run("plots-to-folder", "--overwrite"), f"plots-to-folder/plots {IS_LINK}"),
    # sft, for real: refused before the folder is touched.
    ("sft", in_run("sft-final-to-folder", "--overwrite", kind="sft"), f"sft-final-to-folder/final {IS_LINK}"),
    ("sft", in_run("sft-logs-to-folder", "--overwrite", kind="sft"), f"sft-logs-to-folder/logs {IS_LINK}"),
    ("sft", in_run("sft-record-to-file", "--overwrite", kind="sft"), f"{RECORD} {IS_LINK}"),
    ("sft", in_run("sft-record-to-file", "--overwrite", "--dry-run", kind="sft"), f"{RECORD} {IS_LINK}"),
    ("sft", in_run("record-is-folder", "--overwrite", kind="sft"), f"{RECORD} is a folder"),
    # The trainer and the orchestrator run alone, on a folder lorarl prepared.
    ("lorarl-trainer", alone("logs-to-folder"), f"logs-to-folder/logs {IS_LINK}"),
    ("lorarl-trainer", alone("record-to-file"), f"{RECORD} {IS_LINK}"),
    ("lorarl-trainer", alone("record-is-folder"), f"{RECORD} is a folder"),
    ("lorarl-orchestrator", alone("checkpoints-to-folder"), f"checkpoints {IS_LINK}"),
    ("lorarl-orchestrator", alone("config-to-file"), f"configs/trainer.json {IS_LINK}"),
    # lorarl-plot: an --out (or a run's plots/) that is a link; a plot folder whose record is one.
    ("lorarl-plot", plot_into("figures"), f"figures {IS_LINK}"),
    ("lorarl-plot", plot_into(None, run="plots-to-folder"), f"plots-to-folder/plots {IS_LINK}"),
    ("lorarl-plot", plot_into("plotted"), f"plotted/{RECORD} {IS_LINK}"),
    ("lorarl-plot", plot_into("runs/plots-to-folder/plots/sub"), f"plots-to-folder/plots {IS_LINK}"),
    # lorarl-merge: an --out that is a link, to an earlier merge or an empty folder.
    ("lorarl-merge", merge_into("latest-merge", "--overwrite"), f"latest-merge {IS_LINK}"),
    ("lorarl-merge", merge_into("latest-merge"), f"latest-merge {IS_LINK}"),
    ("lorarl-merge", merge_into("to-empty"), f"to-empty {IS_LINK}"),
    # Third pass (issue 49): other entries, dangling and relative links, each command.
    ("rl", in_run("samples-to-folder", "--overwrite"), f"samples-to-folder/samples {IS_LINK}"),
    ("rl", in_run("broadcasts-to-folder", "--resume"), f"broadcasts-to-folder/broadcasts {IS_LINK}"),
    ("rl", in_run("final-to-folder", "--overwrite"), f"final-to-folder/final {IS_LINK}"),
    ("rl", in_run("commands-to-file", "--overwrite"), f"configs/commands.txt {IS_LINK}"),
    ("rl", in_run("orch-log-to-file", "--resume"), f"logs/orchestrator.log {IS_LINK}"),
    ("rl", in_run("step-to-folder", "--overwrite"), f"checkpoints/step_2 {IS_LINK}"),
    ("rl", in_run("record-to-folder", "--overwrite"), f"record-to-folder/{RECORD} {IS_LINK}"),
    ("rl", in_run("dangling-config", "--overwrite"), f"configs/orchestrator.json {IS_LINK}"),
    ("sft", in_run("sft-configs-to-folder", "--overwrite", kind="sft"), f"sft-configs-to-folder/configs {IS_LINK}"),
    ("sft", in_run("sft-metrics-to-file", "--resume", kind="sft"), f"sft-metrics-to-file/metrics.jsonl {IS_LINK}"),
    ("sft", in_run("sft-lock-to-file", "--overwrite", "--dry-run", kind="sft"), f"sft-lock-to-file/.lock {IS_LINK}"),
    ("lorarl-trainer", alone("metrics-to-file"), f"metrics-to-file/metrics.jsonl {IS_LINK}"),
    ("lorarl-trainer", alone("step-to-folder"), f"checkpoints/step_2 {IS_LINK}"),
    ("lorarl-orchestrator", alone("rollouts-to-folder"), f"rollouts/step_1 {IS_LINK}"),
    ("lorarl-orchestrator", alone("samples-to-folder"), f"samples-to-folder/samples {IS_LINK}"),
    ("lorarl-plot", plot_into("dangling"), "links/dangling is a symbolic link"),
    ("lorarl-plot", plot_into("relative"), f"relative {IS_LINK}"),
    ("lorarl-plot", plot_into("runs/final-to-folder/final/figures"), f"final-to-folder/final {IS_LINK}"),
    ("lorarl-merge", merge_into("dangling"), "links/dangling is a symbolic link"),
    ("lorarl-merge", merge_into("relative", "--overwrite"), f"relative {IS_LINK}"),
    # A resume names a checkpoint (or its half) that is a link, not "no complete checkpoint".
    ("rl", in_run("step-to-folder", "--resume"), f"checkpoints/step_2 {IS_LINK}"),
    ("rl", in_run("half-to-folder", "--resume", "--resume.step", "2"), f"step_2/trainer {IS_LINK}"),
    ("sft", in_run("sft-step-to-folder", "--resume", kind="sft"), f"checkpoints/step_2 {IS_LINK}"),
    ("sft", in_run("sft-step-to-folder", "--resume", "--dry-run", kind="sft"), f"checkpoints/step_2 {IS_LINK}"),
    # A hard link where lorarl writes in place: a dry run rewrote the user's file behind configs/.
    ("rl", in_run("config-hard", "--overwrite"), f"config-hard/configs/trainer.json {IS_HARD}"),
    ("rl", in_run("config-hard", "--resume"), f"config-hard/configs/trainer.json {IS_HARD}"),
    ("rl", in_run("record-hard", "--overwrite"), f"record-hard/{RECORD} {IS_HARD}"),
    ("rl", in_run("metrics-hard", "--resume"), f"metrics-hard/metrics.jsonl {IS_HARD}"),
    ("sft", in_run("log-hard", "--overwrite", kind="sft"), f"log-hard/logs/trainer.log {IS_HARD}"),
    ("lorarl-trainer", alone("config-hard"), f"config-hard/configs/trainer.json {IS_HARD}"),
]


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_a_link_is_refused_in_one_line_and_the_files_behind_it_keep_their_bytes(
    ws: Workspace, capsys: pytest.CaptureFixture[str], case: Case
) -> None:
    command, args, names = case
    before = user_bytes(ws)
    assert_refused(ws, capsys, command, args(ws), names)
    assert user_bytes(ws) == before


def test_a_run_folder_of_links_only_above_it_is_used(
    tmp_path: Path, ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link above the run folder (output_dir on another disk) is the user's choice, not refused."""
    from lorarl.cli import rl

    (tmp_path / "disk").mkdir()
    (tmp_path / "outputs").symlink_to(tmp_path / "disk")
    rl.main(["--model.name", str(ws.model), "--output_dir", str(tmp_path / "outputs"), "--run_name", "r", "--dry-run"])
    capsys.readouterr()
    assert (tmp_path / "disk" / "r" / "configs" / "trainer.json").is_file()
    assert not os.path.islink(tmp_path / "disk" / "r" / RECORD)
