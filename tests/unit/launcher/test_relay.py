"""What the relay does on each node's run folder (cluster.shared_fs = false): whole folders in and
out, complete adapters only, whole metrics lines only."""

from __future__ import annotations

from pathlib import Path

from lorarl.launcher.relay import read_folder, read_lines, stable_steps, write_folder
from lorarl.run_folder import STABLE


def test_an_adapter_folder_travels_whole_and_lands_complete(tmp_path: Path) -> None:
    src = tmp_path / "trainer" / "broadcasts" / "step_1"
    (src / "sub").mkdir(parents=True)
    (src / "adapter_config.json").write_text("{}")
    (src / "sub" / "weights.bin").write_bytes(b"\0\1\2")
    (src / STABLE).touch()
    files = read_folder(str(src))
    assert files == {"adapter_config.json": b"{}", "sub/weights.bin": b"\0\1\2"}  # STABLE is the writer's to add
    (tmp_path / "trainer" / "broadcasts" / "step_2").mkdir()  # still being written: no STABLE
    assert stable_steps(str(tmp_path / "trainer" / "broadcasts")) == [1]
    dest = tmp_path / "inference" / "broadcasts" / "step_1"
    write_folder(str(dest), files, stable=True)
    assert read_folder(str(dest)) == files and (dest / STABLE).exists()
    assert [p.name for p in dest.parent.iterdir()] == ["step_1"]  # no temporary folder left
    write_folder(str(tmp_path / "batch"), {"rollouts.jsonl": b"{}\n"}, stable=False)
    assert not (tmp_path / "batch" / STABLE).exists()


def test_metrics_lines_are_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert read_lines(str(path), 0) == (b"", 0)
    path.write_bytes(b'{"step": 1}\n{"step": 2')  # the second line is still being written
    lines, offset = read_lines(str(path), 0)
    assert lines == b'{"step": 1}\n' and offset == len(lines)
    with open(path, "ab") as f:
        f.write(b"}\n")
    assert read_lines(str(path), offset) == (b'{"step": 2}\n', len(path.read_bytes()))


def test_a_node_that_misses_a_probe_is_named() -> None:
    from lorarl.launcher.ray_cluster import unshared_error

    roles = {"a" * 20: "rl", "b" * 20: "trainer", "c" * 20: "inference-0"}
    probes = {node: f"/runs/exp/.probe-{node}" for node in roles}
    everything = list(probes.values())
    assert unshared_error(Path("/runs/exp"), roles, probes, dict.fromkeys(roles, everything)) is None
    seen = {**dict.fromkeys(roles, everything), "c" * 20: [probes["c" * 20]]}  # its own only
    error = unshared_error(Path("/runs/exp"), roles, probes, seen)
    assert error == (
        f"cluster.shared_fs: the run folder /runs/exp is not shared: node {'c' * 12} (inference-0) does not see "
        f"what node(s) {'a' * 12} (rl), {'b' * 12} (trainer) wrote there; put output_dir on a file system every "
        "node mounts at the same path, or set cluster.shared_fs = false"
    )
