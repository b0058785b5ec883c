"""The run folder (`output_dir/run_name/`): the one place that knows its layout.

    run.json              the marker: lorarl wrote this folder (kind, run name, config hash, start)
    configs/  logs/       per-process configs and commands; one log per process
    rollouts/step_N/      the batch for trainer step N
    broadcasts/step_N/    the adapter after step N (PEFT folder, STABLE last; updated_at.json: when
                          its optimizer step ended, for the hand-off latency perf/adapter_live_s)
    checkpoints/step_N/   trainer/ and orchestrator/ halves
    samples/step_N.jsonl  metrics.jsonl  final/  plots/ (lorarl-plot)

A run with [[variants]] trains several adapters: each has the four step folders above one level down,
rollouts/<variant>/step_N/, broadcasts/<variant>/step_N/, checkpoints/<variant>/step_N/ and
samples/<variant>/step_N.jsonl, through its view `RunFolder.for_variant(name)`; the rest is shared.

Folders that another process reads are written under a temporary name and renamed, and adapter
folders get `STABLE` last, so a reader never sees a half-written step. A folder is cleared only if
its marker says lorarl wrote it, and then only the entries lorarl writes: a user's files are never
touched.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

STABLE = "STABLE"
MARKER = "run.json"
METRICS = "metrics.jsonl"
BATCH_FILE = "rollouts.jsonl"  # in rollouts/step_N/: one rollout per line
LOCK = ".lock"  # held (flock) by the `rl` or `sft` process while the run is alive
MANIFEST = "MANIFEST.json"
UPDATED_AT = "updated_at.json"  # in broadcasts/step_N/: {"time": Unix time its optimizer step ended}
_STEP = re.compile(r"^step_(\d+)$")
# Everything lorarl writes at the top of a run folder; clearing never reaches beyond these.
_OUTPUTS = ("configs", "logs", "rollouts", "broadcasts", "samples", "checkpoints", "final", "plots", METRICS)
# What a resumed run writes again from its checkpoint on; checkpoints and metrics carry over.
_REGENERATED = ("rollouts", "broadcasts", "samples")


class RunFolderError(Exception):
    """The run folder cannot be used as asked; str() is one line for the user."""


class RunFolder:
    def __init__(self, root: Path, variant: str | None = None) -> None:
        self.root = Path(root)
        self.variant = variant  # None: the run's one adapter; else this view's variant (module docstring)
        self._lock_fd: int | None = None

    def for_variant(self, name: str) -> RunFolder:
        """The view of variant `name`: its step folders are one level down, under its name."""
        return RunFolder(self.root, name)

    def _steps(self, kind: str) -> Path:
        """The folder of `kind`'s step entries (rollouts, broadcasts, samples, checkpoints) of this view."""
        return self.root / kind if self.variant is None else self.root / kind / self.variant

    configs = property(lambda self: self.root / "configs")
    logs = property(lambda self: self.root / "logs")
    metrics = property(lambda self: self.root / METRICS)
    final = property(lambda self: self.root / "final")
    plots = property(lambda self: self.root / "plots")
    marker = property(lambda self: self.root / MARKER)

    def rollouts(self, step: int) -> Path:
        return self._steps("rollouts") / f"step_{step}"

    def broadcast(self, step: int) -> Path:
        return self._steps("broadcasts") / f"step_{step}"

    def broadcast_updated_at(self, step: int) -> float | None:
        """When the optimizer step that made broadcasts/step_N ended (Unix time), or None: a starting or
        unchanged adapter, or one written before lorarl recorded it."""
        try:
            return float(json.loads((self.broadcast(step) / UPDATED_AT).read_text())["time"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def samples(self, step: int) -> Path:
        return self._steps("samples") / f"step_{step}.jsonl"

    def probe(self, node: str) -> Path:
        """The file by which node `node` shows the others it sees this folder (removed once read)."""
        return self.root / f".probe-{node}"

    def checkpoint(self, step: int) -> Path:
        """Both halves of the checkpoint of `step`: `trainer/` and `orchestrator/`."""
        return self._steps("checkpoints") / f"step_{step}"

    def trainer_checkpoint(self, step: int) -> Path:
        return self.checkpoint(step) / "trainer"

    def orchestrator_checkpoint(self, step: int) -> Path:
        return self.checkpoint(step) / "orchestrator"

    def checkpoint_steps(self) -> list[int]:
        """Steps whose checkpoint is complete, oldest first: the trainer half, and every other half
        it has (the orchestrator's, written before the trainer's), hold all their manifest lists."""
        return sorted(s for s in step_folders(self._steps("checkpoints")) if self._checkpoint_complete(s))

    def _checkpoint_complete(self, step: int) -> bool:
        halves = [p for p in self.checkpoint(step).iterdir() if not p.name.startswith(".")]
        return self.trainer_checkpoint(step) in halves and all(verify_manifest(half) for half in halves)

    def write_checkpoint_half(self, step: int, half: str, write: Callable[[Path], object]) -> Path:
        """Write `checkpoints/step_N/<half>/` (trainer or orchestrator) whole or not at all."""
        dest = self.checkpoint(step) / half
        write_folder_atomically(dest, write, manifest=True)
        return dest

    def sweep_checkpoint_steps(self, variants: Sequence[str] = ()) -> list[int]:
        """Steps whose checkpoint is complete for every variant named (none named: this view's), oldest
        first: a sweep resumes all its variants from the same step."""
        views = [self.for_variant(v) for v in variants] or [self]
        return sorted(set.intersection(*(set(view.checkpoint_steps()) for view in views)))

    def resume_step(self, step: int | None, variants: Sequence[str] = ()) -> int:
        """The step a run resumes from: `step`, or the latest complete checkpoint when None (with
        `variants`, complete for each of them)."""
        steps = self.sweep_checkpoint_steps(variants)
        if not steps:
            raise RunFolderError(f"--resume: no complete checkpoint in {self.root}")
        if step is None:
            return steps[-1]
        if step not in steps:
            raise RunFolderError(f"--resume.step {step}: no complete checkpoint of that step in {self.root} ({steps})")
        return step

    def latest_stable_broadcast(self) -> int | None:
        """The highest step whose adapter folder is complete, or None."""
        steps = [s for s in step_folders(self._steps("broadcasts")) if (self.broadcast(s) / STABLE).exists()]
        return max(steps, default=None)

    def create(self) -> RunFolder:
        for d in (self.configs, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        return self

    def prepare(self, kind: str, config: dict[str, Any], resume: bool, overwrite: bool, dry_run: bool = False) -> str:
        """Make the folder ready for a run of `kind` ("rl" or "sft"); call it once every other check
        has passed. A new or empty folder gets the marker. A folder that holds a previous run is
        reused only when asked: `resume` keeps its checkpoints and metrics (its logs move to
        logs/previous-<time>/), `overwrite` clears everything lorarl wrote there. A `dry_run` makes
        the same checks and deletes nothing: it marks a new folder as a dry run's, which the next run
        reuses freely. Returns what was done, for the log; raises RunFolderError, having touched
        nothing, when the folder cannot be used as asked."""
        if resume and overwrite:
            raise RunFolderError("--resume continues a run and --overwrite starts it over: give one of them")
        if self.is_alive():
            raise RunFolderError(f"{self.root} belongs to a run that is still going: stop it, or pick another run_name")
        if self.root.exists() and not self.root.is_dir():
            raise RunFolderError(f"{self.root} is a file, not a run folder: choose another output_dir or run_name")
        entries = list(self.root.iterdir()) if self.root.is_dir() else []
        marker = self._read_marker() if entries else None
        if entries and marker is None:
            raise RunFolderError(
                f"{self.root} is not empty and was not written by lorarl (no {MARKER}): it is left untouched; "
                "choose another output_dir or run_name"
            )
        previous = None if marker is None or marker.get("dry_run") else marker
        if resume:
            if previous is None:
                raise RunFolderError(f"--resume: {self.root} holds no run to resume")
            if previous.get("kind") != kind:
                raise RunFolderError(f"--resume: {self.root} holds an {previous.get('kind')} run, not an {kind} run")
        elif previous is not None and not overwrite:
            raise RunFolderError(
                f"{self.root} holds a previous {previous.get('kind')} run (started {previous.get('started')}): "
                "continue it with --resume, or start over with --overwrite, which deletes its outputs"
            )
        if dry_run:
            if marker is None:
                self.root.mkdir(parents=True, exist_ok=True)
                self._write_marker(kind, config, None, dry_run=True)
            return f"dry run: {self.root} checked, nothing cleared"
        if resume:
            self.clear_regenerated()
            self._rotate_logs()
            done = f"resuming the {kind} run in {self.root}"
        elif marker is not None:
            self._remove(_OUTPUTS)
            done = f"cleared the previous run's outputs in {self.root}"
        else:
            done = f"new run folder {self.root}"
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_marker(kind, config, previous if resume else None)
        return done

    def hold_lock(self) -> None:
        """Mark the run alive for as long as this process lives (the lock goes with it, even on SIGKILL)."""
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # prepare() checked no one holds it
        os.set_inheritable(fd, True)  # kept across `sft`'s exec into torchrun; Popen children never get it
        self._lock_fd = fd

    def is_alive(self) -> bool:
        """Whether another process holds this run's lock: its `rl` or `sft` is still going."""
        if self._lock_fd is not None:
            return False  # our own run
        try:
            fd = os.open(self.root / LOCK, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def clear_regenerated(self) -> None:
        """Remove what a resumed run writes again from its checkpoint on (batches, adapters, samples)."""
        self._remove(_REGENERATED)

    def _read_marker(self) -> dict[str, Any] | None:
        try:
            marker = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return None
        return marker if isinstance(marker, dict) and marker.get("lorarl") else None

    def _write_marker(
        self, kind: str, config: dict[str, Any], previous: dict[str, Any] | None, dry_run: bool = False
    ) -> None:
        digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        marker = {"lorarl": 1, "kind": kind, "run_name": self.root.name, "config_hash": digest,
                  "started": previous["started"] if previous else now,
                  "resumed": [*previous.get("resumed", []), now] if previous else [],
                  **({"dry_run": True} if dry_run else {})}  # fmt: skip
        write_file_atomically(self.marker, json.dumps(marker, indent=2) + "\n")

    def _remove(self, names: tuple[str, ...]) -> None:
        for path in (self.root / name for name in names):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()

    def _rotate_logs(self) -> None:
        logs = sorted(self.logs.glob("*.log")) if self.logs.is_dir() else []
        if logs:
            kept = self.logs / f"previous-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}"
            kept.mkdir()
            for log in logs:
                log.rename(kept / log.name)


def step_folders(parent: Path) -> list[int]:
    """The N of every `step_N` entry in `parent` (none if it does not exist)."""
    if not parent.is_dir():
        return []
    return [int(m.group(1)) for p in parent.iterdir() if (m := _STEP.match(p.name))]


def write_folder_atomically(
    dest: Path, write: Callable[[Path], object], stable_marker: bool = False, manifest: bool = False
) -> None:
    """Run `write(tmp)` into a temporary sibling folder, make it durable (fsync), then rename it
    to `dest`. A folder already at `dest` is first renamed aside, so a reader (or a crash) sees the
    old folder, no folder, or the new one, never a mix.

    With `manifest`, MANIFEST.json (every file and its size) is written last, so that a reader can
    verify the folder is whole (`verify_manifest`). With `stable_marker`, an empty `STABLE` file is
    added after the rename, for readers that poll for it (vLLM adapter loading).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    if manifest:
        files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps(files, indent=1) + "\n")
    _fsync_tree(tmp)
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    if stable_marker:
        (dest / STABLE).touch()
        _fsync(dest / STABLE)
    _fsync(dest.parent)
    shutil.rmtree(old, ignore_errors=True)


def verify_manifest(folder: Path) -> bool:
    """Whether `folder` holds every file its MANIFEST.json lists, at the size listed."""
    try:
        files = json.loads((folder / MANIFEST).read_text())
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, AttributeError):
        return False


def write_file_atomically(dest: Path, text: str) -> None:
    """Write `text` to a temporary sibling, fsync it, then rename it over `dest`: a reader sees the
    old file or the new one, never a half-written one."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    _fsync(tmp)
    os.replace(tmp, dest)
    _fsync(dest.parent)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):  # files before the folders that list them
        _fsync(path)
    _fsync(root)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
