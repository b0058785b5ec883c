"""Bad input about the files lorarl writes: user files where lorarl would remove or replace its own
(a run folder, a merge output, a plot folder), folders lorarl did not prepare, output paths that are
files, `/dev/null`, unwritable or too long, and metrics that no plot can draw. Each case is refused
with exit code 2 and one line naming the file or key at fault, and leaves every file as it was (see
`bad_inputs.assert_refused`). The tests after the table check that the commands which do replace
lorarl's files (`rl --overwrite`, `lorarl-merge --overwrite`, `lorarl-plot --out`) keep a user's file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from lorarl.cli import merge, plot, rl
from lorarl.run_folder import RunFolder
from lorarl.written_files import MANIFEST, RECORD
from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, merge_args, rl_args, sft_args

LONG = "r" * 201  # one more than run_name allows
TOO_LONG = "n" * 300  # more than any file system allows in one name
ROW = json.dumps({"step": 1, "component": "trainer", "loss": 0.5})


def files(w: Workspace) -> Path:
    """This file's part of the workspace (`user_files` makes it)."""
    return w.root / "files"


def unwritable(w: Workspace) -> Path:
    """A folder this process cannot create anything in: a read-only one, or as root (for whom
    permissions mean nothing) one on sysfs, which refuses even root."""
    return Path("/sys/lorarl-bad-input") if os.geteuid() == 0 else files(w) / "read-only"


def run_with(w: Workspace, place: str, kind: str = "rl") -> RunFolder:
    """A finished run of `kind` (record, checkpoint of step 2, metrics) with a user's file at `place`."""
    run = RunFolder(files(w) / "runs" / place.replace("/", "-"))
    run.prepare(kind, {}, resume=False, overwrite=False)
    run.write_checkpoint_half(2, "trainer", lambda d: (d / "state.json").write_text('{"step": 2}'))
    (run.root / place).parent.mkdir(parents=True, exist_ok=True)
    (run.root / place).write_text("the user's")
    return run


@pytest.fixture(scope="module", autouse=True)
def user_files(ws: Workspace) -> None:
    for place in (
        "rollouts/step_3/rollouts.jsonl",
        "broadcasts/step_3/adapter_config.json",
        "samples/step_3.jsonl",
        "checkpoints/step_4/trainer/state.json",
        "final/adapter_model.safetensors",
    ):
        run_with(ws, place)
    run_with(ws, "final/adapter_config.json", kind="sft")
    unrecorded = run_with(ws, "notes.txt")  # then made a run folder of before lorarl kept records
    (unrecorded.root / RECORD).unlink()
    figures = files(ws) / "figures"  # a user's folder of figures, one named as lorarl-plot names its own
    figures.mkdir()
    (figures / "overview.png").write_bytes(b"the user's figure")
    plotted = files(ws) / "plotted"  # a run folder whose plots/ holds a user's reward.png
    (plotted / "plots").mkdir(parents=True)
    (plotted / "metrics.jsonl").write_text(json.dumps({"step": 1, "component": "orchestrator", "reward/mean": 1}))
    (plotted / "plots" / "reward.png").write_bytes(b"the user's figure")
    merged = files(ws) / "merged"  # an earlier merge output (its manifest lists its marker) + a user's config.json
    merged.mkdir()
    (merged / "lorarl-merge.json").write_text("{}")
    (merged / MANIFEST).write_text(json.dumps({"lorarl-merge.json": 2}))
    (merged / "config.json").write_text('{"the user": "s"}')
    (files(ws) / "a-file").write_text("not a folder")
    if os.geteuid() != 0:
        unwritable(ws).mkdir(mode=0o555)
    with pytest.raises(OSError):  # really unwritable: creating anything there fails
        (unwritable(ws) / "probe").mkdir(parents=True)


def rl_in(output_dir: str, run_name: str = "new", *more: str) -> Callable[[Workspace], list[str]]:
    """`rl --dry-run` args with this output_dir (`{w.root}/...`, or "unwritable")."""
    return lambda w: [*run_args(w, output_dir, run_name), *more, "--dry-run"]


def sft_in(output_dir: str, run_name: str = "new-sft", *more: str) -> Callable[[Workspace], list[str]]:
    return lambda w: [*run_args(w, output_dir, run_name), "--data.path", str(w.data), *more]


def run_args(w: Workspace, output_dir: str, run_name: str) -> list[str]:
    path = str(unwritable(w)) if output_dir == "unwritable" else output_dir.replace("{w.root}", str(w.root))
    return ["--model.name", str(w.model), "--output_dir", path, "--run_name", run_name]


def alone(output_dir: str, run_name: str) -> Callable[[Workspace], list[str]]:
    """`lorarl-trainer` or `lorarl-orchestrator` args, run alone on this run folder."""
    return lambda w: run_args(w, output_dir, run_name)


def plot_of(*rows: str, out: str | None = None) -> Callable[[Workspace], list[str]]:
    """`lorarl-plot` of a metrics file of these lines (bytes through latin-1), into `out`."""

    def args(w: Workspace) -> list[str]:
        name = f"metrics-{abs(hash(rows))}.jsonl"
        metrics = w.write(name, "\n".join(rows).encode("latin-1") + b"\n")
        folder = str(unwritable(w)) if out == "unwritable" else (out or "").replace("{w.root}", str(w.root))
        return [str(metrics), *(["--out", folder] if out else [])]

    return args


def in_unwritable(tail: str) -> Callable[[Workspace], str]:
    return lambda w: str(unwritable(w) / tail)


CASES: list[Case] = [
    # rl: run names and output_dir that cannot hold a run folder.
    ("rl", rl_args(run_name=LONG), "run_name has 201 characters: at most 200"),
    ("rl", rl_in("{w.root}/inputs/chat.jsonl"), "inputs/chat.jsonl is a file, not a folder"),
    ("rl", rl_in("/dev/null"), "/dev/null is not a folder"),
    ("rl", rl_in("/dev/null/runs"), "/dev/null is not a folder"),
    ("rl", rl_in("{w.root}/thesis/chapter1.tex/runs"), "chapter1.tex is a file, not a folder"),
    ("rl", rl_in("unwritable"), "lorarl-bad-input" if os.geteuid() == 0 else "read-only"),
    ("rl", rl_in(f"{{w.root}}/{TOO_LONG}"), "is longer than a file system allows"),
    # rl: a user's file where the run would take it for its own; a folder without a record.
    ("rl", rl_in("{w.root}/outputs", "previous", "--overwrite"), "previous/metrics.jsonl was not written by lorarl"),
    (
        "rl",
        rl_in("{w.root}/files/runs", "rollouts-step_3-rollouts.jsonl", "--overwrite"),
        "rollouts/step_3/rollouts.jsonl was not written by lorarl",
    ),
    ("rl", rl_in("{w.root}/files/runs", "rollouts-step_3-rollouts.jsonl", "--resume"), "--resume: "),
    (
        "rl",
        rl_in("{w.root}/files/runs", "broadcasts-step_3-adapter_config.json", "--resume"),
        "broadcasts/step_3/adapter_config.json was not written by lorarl",
    ),
    (
        "rl",
        rl_in("{w.root}/files/runs", "samples-step_3.jsonl", "--overwrite"),
        "samples/step_3.jsonl was not written by lorarl",
    ),
    (
        "rl",
        rl_in("{w.root}/files/runs", "checkpoints-step_4-trainer-state.json", "--overwrite"),
        "checkpoints/step_4/trainer/state.json was not written by lorarl",
    ),
    (
        "rl",
        rl_in("{w.root}/files/runs", "final-adapter_model.safetensors", "--overwrite"),
        "final/adapter_model.safetensors was not written by lorarl",
    ),
    ("rl", rl_in("{w.root}/files/runs", "notes.txt", "--overwrite"), "was not written by lorarl"),
    # sft: the same, through its own checks.
    ("sft", sft_args(run_name=LONG), "run_name has 201 characters"),
    ("sft", sft_in("/dev/null"), "/dev/null is not a folder"),
    ("sft", sft_in("unwritable"), "lorarl-bad-input" if os.geteuid() == 0 else "read-only"),
    ("sft", sft_in(f"{{w.root}}/inputs/{TOO_LONG}"), "is longer than a file system allows"),
    (
        "sft",
        sft_in("{w.root}/files/runs", "final-adapter_config.json", "--overwrite"),
        "final/adapter_config.json was not written by lorarl",
    ),
    ("sft", sft_in("{w.root}/files/runs", "samples-step_3.jsonl", "--overwrite"), "samples/step_3.jsonl"),
    # merge: outputs that are files, unwritable, too long; earlier merges with a user's files.
    ("lorarl-merge", merge_args(out="/dev/null"), "--out /dev/null: /dev/null is not a folder"),
    ("lorarl-merge", merge_args(out="/dev/null/merged"), "/dev/null is not a folder"),
    ("lorarl-merge", merge_args(out="{w.root}/inputs/chat.jsonl/merged"), "chat.jsonl is a file, not a folder"),
    (
        "lorarl-merge",
        lambda w: merge_args(out=in_unwritable("merged")(w))(w),
        "lorarl-bad-input" if os.geteuid() == 0 else "read-only",
    ),
    ("lorarl-merge", merge_args(out=f"{{w.root}}/{TOO_LONG}"), "is longer than a file system allows"),
    # argparse's mistakes were its usage block and a second line.
    (
        "lorarl-merge",
        lambda w: ["--base", str(w.model)],
        "command line: the following arguments are required: --adapter",
    ),
    ("lorarl-plot", lambda w: [str(w.root), "--bogus"], "command line: unrecognized arguments: --bogus"),
    # argparse's Path("") is ".": the working directory, refused as "PosixPath('.') has an empty name".
    ("lorarl-merge", merge_args(out=""), "argument --out: an empty path: give a folder or file"),
    (
        "lorarl-merge",
        merge_args("{w.model}", "{w.adapter}", "{w.earlier_merge}", "--overwrite"),
        "holds an earlier merge with no record of its files",
    ),
    (
        "lorarl-merge",
        merge_args("{w.model}", "{w.adapter}", "{w.root}/files/merged", "--overwrite"),
        "config.json there is not in the earlier merge's MANIFEST.json",
    ),
    # lorarl-plot: metrics no plot can draw, and folders it may not write into.
    (
        "lorarl-plot",
        plot_of(json.dumps({"step": 1, "component": "trainer"}).replace("1", "1" + "0" * 400)),
        "step of 401 digits is not a step of a run",
    ),
    ("lorarl-plot", plot_of(ROW, ROW.replace('"step": 1', '"step": -3')), ":2: step -3 is not a step of a run"),
    ("lorarl-plot", plot_of(ROW.replace('"step": 1', '"step": true')), ":1: not a metrics row"),
    ("lorarl-plot", plot_of(ROW.replace('"step": 1', '"step": 2.5')), ":1: not a metrics row"),
    ("lorarl-plot", plot_of(ROW.replace("0.5", "1e400")), ":1: loss is not a finite number up to 1e100"),
    ("lorarl-plot", plot_of(ROW.replace("0.5", "NaN")), ":1: loss is not a finite number up to 1e100"),
    ("lorarl-plot", plot_of(ROW.replace("0.5", "-Infinity")), ":1: loss is not a finite number up to 1e100"),
    ("lorarl-plot", plot_of(ROW.replace("0.5", "1" + "0" * 400)), ":1: loss is not a finite number up to 1e100"),
    ("lorarl-plot", plot_of(ROW, ROW.replace("trainer", "tr\xe9iner")), ":2: not UTF-8 text"),
    ("lorarl-plot", plot_of(ROW.replace("0.5", "1e308")), ":1: loss is not a finite number up to 1e100"),
    ("lorarl-plot", plot_of(ROW.replace('"trainer"', '"trainer", "variant": ["a"]')), ":1: variant is not a name"),
    ("lorarl-plot", plot_of(ROW, ROW.replace('"trainer"', '"trainer", "variant": 7')), ":2: variant is not a name"),
    ("lorarl-plot", plot_of(ROW, out="{w.root}/inputs/chat.jsonl"), "chat.jsonl is a file, not a folder"),
    ("lorarl-plot", plot_of(ROW, out="/dev/null"), "/dev/null is not a folder"),
    ("lorarl-plot", plot_of(ROW, out="unwritable"), "lorarl-bad-input" if os.geteuid() == 0 else "read-only"),
    ("lorarl-plot", plot_of(ROW, out=f"{{w.root}}/{TOO_LONG}"), "is longer than a file system allows"),
    ("lorarl-plot", plot_of(ROW, out="{w.root}/files/figures"), "overview.png there was not written by lorarl-plot"),
    ("lorarl-plot", lambda w: [str(files(w) / "plotted")], "reward.png there was not written by lorarl-plot"),
    # trainer and orchestrator run alone: only into a folder that lorarl prepared.
    ("lorarl-trainer", alone("{w.root}/outputs", "new"), "is not a run folder (no run.json): trainer run alone"),
    ("lorarl-trainer", alone("{w.root}", "thesis"), "thesis is not a run folder"),
    ("lorarl-trainer", alone("/dev/null", "new"), "/dev/null/new is not a run folder"),
    ("lorarl-trainer", alone("{w.root}/outputs", LONG), "run_name has 201 characters"),
    (
        "lorarl-orchestrator",
        alone("{w.root}/outputs", "new"),
        "is not a run folder (no run.json): orchestrator run alone",
    ),
    ("lorarl-orchestrator", alone("{w.root}/outputs", "mine"), "mine is not a run folder"),
    ("lorarl-orchestrator", alone("unwritable", "new"), "is not a run folder"),
    ("lorarl-orchestrator", alone("{w.root}/outputs", LONG), "run_name has 201 characters"),
]


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_bad_file_input_is_refused_in_one_line_and_touches_nothing(
    ws: Workspace, capsys: pytest.CaptureFixture[str], case: Case
) -> None:
    command, args, names = case
    assert_refused(ws, capsys, command, args(ws), names)


def test_overwrite_keeps_a_users_files(tmp_path: Path, ws: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    """The folder of a real `rl --dry-run`, cleared as the run after it clears it (RunFolder.prepare, as
    `rl --overwrite` does): every file that `rl` wrote goes, the user's files stay."""
    rl.main(["--model.name", str(ws.model), "--output_dir", str(tmp_path), "--run_name", "r", "--dry-run"])
    capsys.readouterr()
    run = RunFolder(tmp_path / "r")
    written = sorted(p.name for p in run.configs.iterdir())
    assert {"trainer.json", "commands.txt", "memory_plan.txt"} <= set(written)
    mine = [run.root / "notes.txt", run.configs / "my-config.toml", run.plots / "my-figure.png"]
    for path in mine:
        path.parent.mkdir(exist_ok=True)
        path.write_text("the user's")
    assert run.prepare("rl", {}, resume=False, overwrite=True).startswith("cleared")
    assert all(path.read_text() == "the user's" for path in mine)
    assert sorted(p.name for p in run.configs.iterdir()) == ["my-config.toml"]


def test_merge_overwrite_keeps_a_users_file(tmp_path: Path, ws: Workspace) -> None:
    out = tmp_path / "merged"
    args = ["--base", str(ws.model), "--adapter", str(ws.adapter), "--out", str(out)]
    merge.main(args)
    (out / "NOTES.md").write_text("the user's")
    merge.main([*args, "--overwrite"])
    assert (out / "NOTES.md").read_text() == "the user's"
    assert "NOTES.md" not in json.loads((out / MANIFEST).read_text())  # and still not lorarl's
    assert (out / "config.json").is_file() and not list(tmp_path.glob(".merged.*"))


def test_plot_out_keeps_a_users_files_and_replaces_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(ROW + "\n")
    out = tmp_path / "figures"
    out.mkdir()
    (out / "my-figure.png").write_bytes(b"the user's")
    plot.main([str(metrics), "--out", str(out)])
    first = (out / "loss.png").stat().st_mtime_ns
    plot.main([str(metrics), "--out", str(out)])  # its own PNGs: replaced
    assert (out / "loss.png").stat().st_mtime_ns > first
    assert (out / "my-figure.png").read_bytes() == b"the user's"
    assert sorted(p.name for p in out.iterdir()) == [RECORD, "loss.png", "my-figure.png", "overview.png"]
    capsys.readouterr()
