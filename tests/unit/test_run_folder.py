import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorarl.run_folder import RunFolder, RunFolderError, write_folder_atomically


def test_latest_stable_broadcast_ignores_unfinished_folders(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    assert run.latest_stable_broadcast() is None
    for step in (0, 1):
        run.broadcast(step).parent.mkdir(parents=True, exist_ok=True)
        write_folder_atomically(run.broadcast(step), lambda d: (d / "x").write_text("w"), stable_marker=True)
    run.broadcast(2).mkdir()  # being written: no STABLE yet
    assert run.latest_stable_broadcast() == 1
    assert (run.broadcast(1) / "x").read_text() == "w"
    assert not list(run.broadcast(1).parent.glob(".*tmp*"))


def prepare(root: Path, resume: bool = False, overwrite: bool = False, dry_run: bool = False, kind: str = "rl") -> str:
    return RunFolder(root).prepare(kind, {"lr": 1e-3}, resume=resume, overwrite=overwrite, dry_run=dry_run)


def finished_run(root: Path) -> RunFolder:
    """A folder as a finished run leaves it, plus a file of the user's."""
    prepare(root)
    run = RunFolder(root).create()
    run.write_checkpoint_half(2, "trainer", lambda d: (d / "state.json").write_text("{}"))
    for path in (run.metrics, run.rollouts(1) / "rollouts.jsonl",
                 run.logs / "trainer.log", run.samples(1), run.final / "adapter_config.json"):  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    (root / "notes.txt").write_text("mine")
    return run


def test_a_new_folder_gets_the_marker_and_a_second_run_needs_resume_or_overwrite(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "r")
    marker = json.loads(run.marker.read_text())
    assert marker["kind"] == "rl" and marker["run_name"] == "r" and len(marker["config_hash"]) == 16
    before = sorted(p.relative_to(run.root) for p in run.root.rglob("*"))
    with pytest.raises(RunFolderError, match="holds a previous rl run .* --resume, or start over with --overwrite"):
        prepare(run.root)
    with pytest.raises(RunFolderError, match="give one of them"):
        prepare(run.root, resume=True, overwrite=True)
    prepare(run.root, dry_run=True, overwrite=True)  # a dry run deletes nothing, whatever the flags
    assert sorted(p.relative_to(run.root) for p in run.root.rglob("*")) == before


def test_overwrite_clears_only_what_lorarl_writes(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "r")
    prepare(run.root, overwrite=True)
    assert sorted(p.name for p in run.root.iterdir()) == ["notes.txt", "run.json"]


def test_resume_keeps_checkpoints_and_metrics_and_rotates_logs(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "r")
    started = json.loads(run.marker.read_text())["started"]
    prepare(run.root, resume=True)
    assert run.checkpoint_steps() == [2] and run.metrics.is_file() and (run.root / "notes.txt").is_file()
    assert not run.rollouts(1).exists() and not run.samples(1).exists()
    (kept,) = run.logs.glob("previous-*/trainer.log")
    assert kept.read_text() == "{}"
    marker = json.loads(run.marker.read_text())
    assert marker["started"] == started and len(marker["resumed"]) == 1
    with pytest.raises(RunFolderError, match="holds an rl run, not an sft run"):
        prepare(run.root, resume=True, kind="sft")
    with pytest.raises(RunFolderError, match="no complete checkpoint of that step"):
        run.resume_step(3)
    assert run.resume_step(None) == 2


def test_a_folder_lorarl_did_not_write_is_never_touched(tmp_path: Path) -> None:
    user = tmp_path / "thesis"
    (user / "checkpoints").mkdir(parents=True)
    (user / "checkpoints" / "chapter1.tex").write_text("precious")
    for flags in ({}, {"overwrite": True}, {"resume": True}, {"dry_run": True}):
        with pytest.raises(RunFolderError, match="was not written by lorarl"):
            prepare(user, **flags)
    assert (user / "checkpoints" / "chapter1.tex").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="is a file"):
        prepare(tmp_path / "file", overwrite=True)
    with pytest.raises(RunFolderError, match="holds no run to resume"):
        prepare(tmp_path / "empty", resume=True)
    assert not (tmp_path / "empty").exists()


def test_a_dry_run_folder_is_reused_freely(tmp_path: Path) -> None:
    prepare(tmp_path / "r", dry_run=True)
    RunFolder(tmp_path / "r").configs.mkdir()
    assert prepare(tmp_path / "r").startswith("cleared")  # its configs/ go; no --overwrite needed
    assert "dry_run" not in json.loads((tmp_path / "r" / "run.json").read_text())


def test_a_checkpoint_is_complete_only_when_every_half_matches_its_manifest(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    for step in (1, 2, 3):
        for half in ("orchestrator", "trainer"):
            run.write_checkpoint_half(step, half, lambda d: (d / "state.json").write_text('{"step": 1}'))
    assert run.checkpoint_steps() == [1, 2, 3]
    (run.trainer_checkpoint(2) / "state.json").write_text("{")  # cut short
    (run.orchestrator_checkpoint(3) / "MANIFEST.json").unlink()
    run.write_checkpoint_half(4, "orchestrator", lambda d: None)  # the trainer's half never came
    assert run.checkpoint_steps() == [1]


# Writes a checkpoint half and a broadcast over and over, with files big enough to be caught half-way.
_WRITER = """
import sys
from pathlib import Path
from lorarl.run_folder import RunFolder, write_folder_atomically
run = RunFolder(Path(sys.argv[1]))
def write(d):
    for name in ("a.bin", "b.bin"):
        (d / name).write_bytes(b"x" * 2_000_000)
print("ready", flush=True)
while True:
    run.write_checkpoint_half(1, "trainer", write)
    write_folder_atomically(run.broadcast(1), write, stable_marker=True)
"""


def test_killed_writers_never_leave_a_partial_checkpoint_or_adapter(tmp_path: Path) -> None:
    """100 writers killed (SIGKILL) at random moments: each time, what a reader would take is whole."""
    rng = random.Random(0)
    run = RunFolder(tmp_path)
    seen = {"checkpoint": 0, "broadcast": 0}
    for _ in range(100):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 0.05))
        proc.kill()
        proc.wait()
        if run.checkpoint_steps() == [1]:
            seen["checkpoint"] += 1
            assert sorted(p.name for p in run.trainer_checkpoint(1).iterdir()) == ["MANIFEST.json", "a.bin", "b.bin"]
        if run.latest_stable_broadcast() == 1:
            seen["broadcast"] += 1
            assert all((run.broadcast(1) / n).stat().st_size == 2_000_000 for n in ("a.bin", "b.bin"))
    assert seen["checkpoint"] > 10 and seen["broadcast"] > 10  # the kills did land after complete writes too


def test_a_variants_view_has_its_step_folders_under_its_name(tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "run")
    view = run.for_variant("r16")
    assert view.root == run.root and view.metrics == run.metrics and view.variant == "r16"
    assert view.broadcast(3) == run.root / "broadcasts" / "r16" / "step_3"
    assert view.rollouts(3) == run.root / "rollouts" / "r16" / "step_3"
    assert view.samples(3) == run.root / "samples" / "r16" / "step_3.jsonl"
    assert view.trainer_checkpoint(3) == run.root / "checkpoints" / "r16" / "step_3" / "trainer"
    write_folder_atomically(view.broadcast(2), lambda d: None, stable_marker=True)
    assert view.latest_stable_broadcast() == 2 and run.latest_stable_broadcast() is None
    with pytest.raises(RunFolderError, match="no complete checkpoint"):
        run.resume_step(None, ["r16", "r1"])
