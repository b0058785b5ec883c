from pathlib import Path

from lorarl.run_folder import RunFolder, write_folder_atomically


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
