import errno
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorarl.run_folder import DiskFull, RunFolder, RunFolderError, write_folder_atomically
from lorarl.written_files import RECORD, record_written, recorded, written_files


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
    """A folder as a finished run leaves it (each file recorded as lorarl's writers record it), plus
    files of the user's: one at the top, one in logs/, one in plots/."""
    prepare(root)
    run = RunFolder(root).create()
    run.write_checkpoint_half(2, "trainer", lambda d: (d / "state.json").write_text("{}"))
    write_folder_atomically(run.rollouts(1), lambda d: (d / "rollouts.jsonl").write_text("{}"))
    for path in (
        run.metrics,
        run.logs / "trainer.log",
        run.samples(1),
        run.final / "adapter_config.json",
        run.plots / "reward.png",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        record_written(path)
    for path in (root / "notes.txt", run.logs / "my-notes.log", run.plots / "my-figure.png"):
        path.write_text("mine")
    return run


def users_files(run: RunFolder) -> list[Path]:
    return [run.root / "notes.txt", run.logs / "my-notes.log", run.plots / "my-figure.png"]


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


def test_overwrite_clears_only_what_lorarl_wrote(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "r")
    prepare(run.root, overwrite=True)
    left = sorted(str(p.relative_to(run.root)) for p in run.root.rglob("*") if p.is_file())
    assert left == [".lorarl-written", "logs/my-notes.log", "notes.txt", "plots/my-figure.png", "run.json"]
    assert all(p.read_text() == "mine" for p in users_files(run))
    assert recorded(run.root) == ["run.json"]  # the record forgets what was removed


@pytest.mark.parametrize(
    "place",
    [
        "checkpoints/step_2/trainer/extra.pt",
        "rollouts/step_7/rollouts.jsonl",
        "broadcasts/step_1/adapter_model.safetensors",
        "final/adapter_model.bin",
        "samples/step_9.jsonl",
    ],
)
def test_a_file_lorarl_did_not_write_where_the_run_reads_is_refused_by_name(tmp_path: Path, place: str) -> None:
    run = finished_run(tmp_path / "r")
    (run.root / place).parent.mkdir(parents=True, exist_ok=True)
    (run.root / place).write_text("not lorarl's")
    before = sorted(p.relative_to(run.root) for p in run.root.rglob("*"))
    for flags in ({"overwrite": True}, {"overwrite": True, "dry_run": True}):
        with pytest.raises(RunFolderError, match=f"--overwrite: .*{place} was not written by lorarl"):
            prepare(run.root, **flags)
    with pytest.raises(RunFolderError, match=f"--resume: .*{place} was not written by lorarl"):
        prepare(run.root, resume=True)
    assert sorted(p.relative_to(run.root) for p in run.root.rglob("*")) == before


def test_a_run_folder_without_a_record_is_not_cleared(tmp_path: Path) -> None:
    """One written before lorarl kept records: nothing in it can be told from a user's file."""
    run = finished_run(tmp_path / "r")
    (run.root / RECORD).unlink()
    with pytest.raises(RunFolderError, match="was not written by lorarl"):
        prepare(run.root, overwrite=True)
    assert run.metrics.is_file() and run.checkpoint_steps() == [2]


def test_resume_keeps_checkpoints_and_metrics_and_rotates_logs(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "r")
    started = json.loads(run.marker.read_text())["started"]
    prepare(run.root, resume=True)
    assert run.checkpoint_steps() == [2] and run.metrics.is_file()
    assert all(p.read_text() == "mine" for p in users_files(run))  # my-notes.log is not rotated: not lorarl's
    assert not run.rollouts(1).exists() and not run.samples(1).exists()
    (kept,) = run.logs.glob("previous-*/trainer.log")
    assert kept.read_text() == "{}"
    assert kept in written_files(run.root)  # an overwrite later removes it
    marker = json.loads(run.marker.read_text())
    assert marker["started"] == started and len(marker["resumed"]) == 1
    with pytest.raises(RunFolderError, match="holds an rl run, not an sft run"):
        prepare(run.root, resume=True, kind="sft")
    with pytest.raises(RunFolderError, match="no complete checkpoint of that step"):
        run.resume_step(3)
    assert run.resume_step(None) == 2


def test_a_resume_forgets_what_was_written_after_its_checkpoint_before_any_process_starts(tmp_path: Path) -> None:
    """Rows and checkpoints past the step resumed from go in `prepare`, not as the trainer loads: the
    resumed orchestrator logs its first steps meanwhile, and those rows stay."""
    run = finished_run(tmp_path / "r")
    run.write_checkpoint_half(3, "orchestrator", lambda d: (d / "sampler.json").write_text("{}"))
    run.write_checkpoint_half(3, "trainer", lambda d: (d / "state.json").write_text("{}"))
    rows = [{"step": s, "component": c} for s in (1, 2, 3) for c in ("trainer", "orchestrator")]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "comp')  # cut short
    prepare_resume = RunFolder(run.root).prepare("rl", {"lr": 1e-3}, True, False, resume_from=lambda: 2)
    assert prepare_resume.startswith("resuming")
    assert run.checkpoint_steps() == [2] and not run.checkpoint(3).exists()
    assert [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()] == [1, 1, 2, 2]
    assert run.metrics in written_files(run.root)  # still lorarl's: an overwrite removes it


def test_a_folder_lorarl_did_not_write_is_never_touched(tmp_path: Path) -> None:
    user = tmp_path / "thesis"
    (user / "checkpoints").mkdir(parents=True)
    (user / "checkpoints" / "chapter1.tex").write_text("precious")
    for flags in ({}, {"overwrite": True}, {"resume": True}, {"dry_run": True}):
        with pytest.raises(RunFolderError, match="was not written by lorarl"):
            prepare(user, **flags)
    assert (user / "checkpoints" / "chapter1.tex").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "run", Path("/dev/null"), Path("/dev/null/run")):
        with pytest.raises(RunFolderError, match="is a file, not a folder|is not a folder"):
            prepare(path, overwrite=True)
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


@pytest.mark.slow
def test_killed_writers_never_leave_a_partial_checkpoint_or_adapter(tmp_path: Path) -> None:
    """100 writers killed (SIGKILL) at random moments: each time, what a reader would take is whole."""
    rng = random.Random(0)
    run = RunFolder(tmp_path)
    seen = {"checkpoint": 0, "broadcast": 0}
    for _ in range(100):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 0.2))  # one round of both writes: ~0.1 s here
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


def corrupt_same_size(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_checkpoint_damaged_at_the_same_size_is_skipped_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = RunFolder(tmp_path)
    for step in (2, 4):
        run.write_checkpoint_half(step, "trainer", lambda d: (d / "optimizer.pt").write_bytes(bytes(range(256))))
    corrupt_same_size(run.trainer_checkpoint(4) / "optimizer.pt")
    assert run.checkpoint_steps() == [2, 4]  # sizes alone cannot tell
    assert run.checkpoint_problem(4) == f"{run.trainer_checkpoint(4) / 'optimizer.pt'} does not match its SHA-256"
    with caplog.at_level("INFO", logger="lorarl.run_folder"):
        assert run.resume_step(None) == 2
    assert "skipping checkpoint step 4: " in caplog.text and "does not match its SHA-256" in caplog.text
    assert "resuming from checkpoint step 2" in caplog.text
    with pytest.raises(RunFolderError, match="--resume.step 4: its checkpoint is damaged: .*optimizer.pt"):
        run.resume_step(4)


def test_removing_a_checkpoint_or_replacing_a_folder_keeps_a_users_file(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "r")
    mine = run.trainer_checkpoint(2) / "my-notes.txt"
    mine.write_text("mine")
    run.remove_checkpoint(2)
    assert mine.read_text() == "mine" and sorted(p.name for p in run.trainer_checkpoint(2).iterdir()) == [mine.name]
    folder = run.broadcast(1)
    write_folder_atomically(folder, lambda d: (d / "adapter.bin").write_text("old"), stable_marker=True)
    (folder / "README.txt").write_text("mine")
    write_folder_atomically(folder, lambda d: (d / "adapter.bin").write_text("new"), stable_marker=True)
    assert (folder / "adapter.bin").read_text() == "new" and (folder / "README.txt").read_text() == "mine"
    with pytest.raises(RunFolderError, match="README.txt was not written by lorarl .* would be replaced"):
        write_folder_atomically(folder, lambda d: (d / "README.txt").write_text("lorarl's"))
    assert (folder / "README.txt").read_text() == "mine" and (folder / "adapter.bin").read_text() == "new"
    assert not list(folder.parent.glob(".step_1.*"))  # no temporary left behind


def test_trainer_or_orchestrator_alone_needs_a_prepared_folder(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="not a run folder .* trainer run alone writes only into one"):
        RunFolder(tmp_path / "r").check_prepared("trainer")
    prepare(tmp_path / "r", dry_run=True)
    RunFolder(tmp_path / "r").check_prepared("trainer")


def test_a_forged_record_or_manifest_cannot_reach_outside_its_folder(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    run = finished_run(tmp_path / "r")
    with open(run.root / RECORD, "a") as f:
        f.write("../victim.txt\n/etc/hostname\n")
    manifest = run.trainer_checkpoint(2) / "MANIFEST.json"
    manifest.write_text(json.dumps({"../../../../victim.txt": 10, "state.json": 2}))
    run.remove_checkpoint(2)
    prepare(run.root, overwrite=True)
    assert victim.read_text() == "the user's" and Path("/etc/hostname").exists()


def test_a_link_put_in_place_of_lorarls_folder_leads_nowhere(tmp_path: Path) -> None:
    """samples/ and a checkpoint replaced by links to a user's folder holding files of the same names."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "step_1.jsonl").write_text("the user's")
    (user / "state.json").write_text("the user's")
    (user / "MANIFEST.json").write_text(json.dumps({"state.json": 10}))
    run = finished_run(tmp_path / "r")
    run.samples(1).unlink()
    run.samples(1).parent.rmdir()
    run.samples(1).parent.symlink_to(user)
    trainer = run.trainer_checkpoint(2)
    for path in trainer.iterdir():
        path.unlink()
    trainer.rmdir()
    trainer.symlink_to(user)
    run.remove_checkpoint(2)
    run.clear_regenerated()
    assert sorted(p.name for p in user.iterdir()) == ["MANIFEST.json", "state.json", "step_1.jsonl"]


def test_every_newer_checkpoint_passed_over_is_named_with_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An incomplete one (only the orchestrator's half: the trainer died before writing its own)
    is named as a damaged one is; a check made before the resuming process says it is silent."""
    run = RunFolder(tmp_path)
    run.write_checkpoint_half(2, "trainer", lambda d: (d / "optimizer.pt").write_bytes(b"state"))
    run.write_checkpoint_half(3, "orchestrator", lambda d: (d / "sampler.json").write_text("{}"))
    with caplog.at_level("INFO", logger="lorarl.run_folder"):
        assert run.resume_step(None, quiet=True) == 2
    assert caplog.text == ""
    with caplog.at_level("INFO", logger="lorarl.run_folder"):
        assert run.resume_step(None) == 2
    assert "skipping checkpoint step 3: it has no trainer half" in caplog.text
    assert "resuming from checkpoint step 2" in caplog.text


def test_interrupted_checkpoint_writes_are_removed_at_the_next_start_and_by_pruning(tmp_path: Path) -> None:
    """A `.trainer.tmp-<pid>` a kill or a full disk left in a checkpoint goes at --resume and when
    keep_last prunes its checkpoint; a folder moved aside (maybe the only whole copy) stays."""
    run = RunFolder(tmp_path / "run")
    run.prepare("rl", {}, resume=False, overwrite=False)
    for step in (1, 2):
        run.write_checkpoint_half(step, "trainer", lambda d: (d / "state.json").write_text("{}"))
    for step in (1, 2, 3):
        (run.checkpoint(step) / f".trainer.tmp-{1000 + step}").mkdir(parents=True)
        (run.checkpoint(step) / f".trainer.tmp-{1000 + step}" / "optimizer.pt").write_bytes(b"half")
    (run.checkpoint(2) / ".trainer.old-77").mkdir()
    run.remove_checkpoint(1)
    assert not (run.checkpoint(1) / ".trainer.tmp-1001").exists() and not run.checkpoint(1).exists()
    assert (run.checkpoint(2) / ".trainer.tmp-1002").exists()  # not pruned, not a start: a write may be under way
    run.prepare("rl", {}, resume=True, overwrite=False)
    assert not (run.checkpoint(2) / ".trainer.tmp-1002").exists()
    assert not (run.checkpoint(3) / ".trainer.tmp-1003").exists()
    assert (run.checkpoint(2) / ".trainer.old-77").is_dir()
    assert run.resume_step(None) == 2


def test_a_full_disk_is_one_line_naming_the_folder_and_its_free_space_and_leaves_no_partial_write(
    tmp_path: Path,
) -> None:
    def fills_the_disk(folder: Path) -> None:
        (folder / "optimizer.pt").write_bytes(b"half of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    run = RunFolder(tmp_path)
    with pytest.raises(DiskFull) as full:
        run.write_checkpoint_half(3, "trainer", fills_the_disk)
    message = str(full.value)
    assert (
        f"no space left on the device of {run.checkpoint(3)} (" in message and "MiB free) to write trainer" in message
    )
    assert "\n" not in message
    assert list(run.checkpoint(3).iterdir()) == []  # the partial write removed
