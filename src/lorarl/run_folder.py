"""The run folder (`output_dir/run_name/`): the one place that knows its layout.

    run.json              the marker: lorarl wrote this folder (kind, run name, config hash, start)
    .lorarl-written       the record of the files lorarl wrote here (written_files.py)
    configs/  logs/       per-process configs and commands; one log per process
    rollouts/step_N/      the batch for trainer step N
    broadcasts/step_N/    the adapter after step N (PEFT folder, STABLE last; updated_at.json: when
                          its optimizer step ended, for the hand-off latency perf/adapter_live_s)
    checkpoints/step_N/   trainer/ and orchestrator/ halves
    samples/step_N.jsonl  metrics.jsonl  final/  plots/ (lorarl-plot)
    served_base/          with model.quantization: the base as the trainer sees it, which vLLM serves

A run with [[variants]] trains several adapters: each has the four step folders above one level down,
rollouts/<variant>/step_N/, broadcasts/<variant>/step_N/, checkpoints/<variant>/step_N/ and
samples/<variant>/step_N.jsonl, through its view `RunFolder.for_variant(name)`; the rest is shared.

Folders that another process reads are written under a temporary name and renamed, and adapter
folders get `STABLE` last, so a reader never sees a half-written step. Every file lorarl writes here
is in the folder's record (written_files.py); a folder is cleared only if its marker says lorarl wrote it,
and then only of the files its record lists: a user's files are never touched, and where one would
mislead the run (a stale batch or checkpoint among lorarl's), the run is refused naming it. lorarl
makes no symbolic links: one at the record, the marker or anywhere under what it writes here leads to
someone else's files, and the run is refused naming it before anything is written (`_refuse_links`);
the writers below also refuse one on their path inside the folder, for what runs alone.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lorarl import run_identity
from lorarl.written_files import (
    MANIFEST,
    STABLE,
    foreign_files,
    forget_missing,
    link_in_way,
    link_refusal,
    links_under,
    manifest_problem,
    record,
    record_problem,
    record_root,
    record_written,
    remove_folder,
    remove_written,
    unwritten,
    write_manifest,
    written_files,
)

_INTERRUPTED = re.compile(r"^\..+\.tmp-\d+$")  # written.TEMPORARY's half-written folders, not those moved aside
log = logging.getLogger("lorarl.run_folder")
MARKER = "run.json"
METRICS = "metrics.jsonl"
BATCH_FILE = "rollouts.jsonl"  # in rollouts/step_N/: one rollout per line
LOCK = ".lock"  # held (flock) by the `rl` or `sft` process while the run is alive
UPDATED_AT = "updated_at.json"  # in broadcasts/step_N/: {"time": Unix time its optimizer step ended}
# In broadcasts/step_N/: the served-adapter check's probe, {"sequences", "logprobs", "base"} (trainer/served_probe.py).
PROBE_FILE = "served_probe.json"
_STEP = re.compile(r"^step_(\d+)$")
_NAME_MAX = 255  # bytes in one file name, on every file system lorarl runs on
# Everything lorarl writes at the top of a run folder; clearing never reaches beyond these, and
# within them removes only the files the folder's record lists.
# lorarl-serve's: its tenants' saved states and its database (serve/folder.py, serve/store.py).
SERVE_OUTPUTS = ("tenants", "serve.sqlite", "serve.sqlite-wal", "serve.sqlite-shm")
_OUTPUTS = (
    "configs",
    "logs",
    "rollouts",
    "broadcasts",
    "samples",
    "checkpoints",
    "final",
    "plots",
    "served_base",  # a quantized base as the trainer sees it, which vLLM serves (quantized_base.py)
    METRICS,
    *SERVE_OUTPUTS,
)
# What a resumed run writes again from its checkpoint on; checkpoints and metrics carry over.
_REGENERATED = ("rollouts", "broadcasts", "samples")
# Where a file lorarl did not write would be taken for the run's own (a batch, an adapter, a checkpoint,
# metrics): a run that would keep one there is refused. Elsewhere (configs, logs, plots) it just stays.
_READ = (*_REGENERATED, "checkpoints", "final", METRICS, *SERVE_OUTPUTS)


class RunFolderError(Exception):
    """The run folder cannot be used as asked; str() is one line for the user."""


class DiskFull(OSError):
    """A write found no space left: str() is one line naming the folder and its free space."""


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
    broadcasts = property(lambda self: self._steps("broadcasts"))  # the step_N adapters of this view
    rollouts_folder = property(lambda self: self._steps("rollouts"))  # the step_N batches of this view

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
        it has (the orchestrator's, written before the trainer's), hold all their manifest lists at
        the sizes listed (their checksums are verified by `resume_step`, on the one it picks)."""
        return sorted(s for s in step_folders(self._steps("checkpoints")) if not self.checkpoint_problem(s, False))

    def checkpoint_problem(self, step: int, checksums: bool = True) -> str | None:
        """Why the checkpoint of `step` cannot be resumed from (a few words naming the file), or None."""
        if not self.checkpoint(step).is_dir():
            return f"{self.checkpoint(step)} is missing"
        halves = [p for p in self.checkpoint(step).iterdir() if p.is_dir() and not p.name.startswith(".")]
        if self.trainer_checkpoint(step) not in halves:
            return "it has no trainer half"
        return next(filter(None, (manifest_problem(half, checksums) for half in halves)), None)

    def write_checkpoint_half(self, step: int, half: str, write: Callable[[Path], object]) -> Path:
        """Write `checkpoints/step_N/<half>/` (trainer or orchestrator) whole or not at all, with the
        SHA-256 of each file in its manifest."""
        dest = self.checkpoint(step) / half
        write_folder_atomically(dest, write, checksums=True)
        return dest

    def remove_checkpoint(self, step: int) -> None:
        """Delete the checkpoint of `step`: the files lorarl wrote in it (a user's stay), and what
        interrupted writes of its halves left there (no writer is left in a checkpoint this old)."""
        remove_interrupted_writes(self.checkpoint(step))
        for half in (p for p in self.checkpoint(step).iterdir() if p.is_dir()):
            remove_folder(half, self.root)

    def sweep_checkpoint_steps(self, variants: Sequence[str] = ()) -> list[int]:
        """Steps whose checkpoint is complete for every variant named (none named: this view's), oldest
        first: a sweep resumes all its variants from the same step."""
        views = [self.for_variant(v) for v in variants] or [self]
        return sorted(set.intersection(*(set(view.checkpoint_steps()) for view in views)))

    def resume_step(self, step: int | None, variants: Sequence[str] = (), quiet: bool = False) -> int:
        """The step a run resumes from: `step`, or when None the latest checkpoint that is whole (every
        file at its size and SHA-256; with `variants`, for each of them). Unless `quiet` (a check before
        the process that resumes says it), each newer one skipped is logged with why (the half or file
        at fault), and the step chosen too."""
        views = [self.for_variant(v) for v in variants] or [self]
        steps = self.sweep_checkpoint_steps(variants)
        # Every step folder, whole or not, so that each newer one passed over is named with its reason.
        found = sorted(set().union(*(step_folders(view._steps("checkpoints")) for view in views)))
        for candidate in reversed(found if step is None else [s for s in found if s == step]):
            problem = next(filter(None, (view.checkpoint_problem(candidate) for view in views)), None)
            if problem is None:
                if not quiet:
                    log.info("resuming from checkpoint step %d in %s", candidate, self.root)
                return candidate
            if step is not None:
                raise RunFolderError(f"--resume.step {step}: its checkpoint is damaged: {problem}")
            if not quiet:
                log.warning("skipping checkpoint step %d: %s", candidate, problem)
        if step is None:
            raise RunFolderError(f"--resume: no complete checkpoint in {self.root}")
        raise RunFolderError(f"--resume.step {step}: no complete checkpoint of that step in {self.root} ({steps})")

    def latest_stable_broadcast(self) -> int | None:
        """The highest step whose adapter folder is complete, or None."""
        steps = [s for s in step_folders(self._steps("broadcasts")) if (self.broadcast(s) / STABLE).exists()]
        return max(steps, default=None)

    def create(self) -> RunFolder:
        for d in (self.configs, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        return self

    def prepare(
        self,
        kind: str,
        config: dict[str, Any],
        resume: bool,
        overwrite: bool,
        dry_run: bool = False,
        resume_from: Callable[[], int] | None = None,
        variants: Sequence[str] = (),
    ) -> str:
        """Make the folder ready for a run of `kind` ("rl", "sft" or "serve"); call it once every other check
        has passed. A new or empty folder gets the marker. A folder that holds a previous run is
        reused only when asked: `resume` keeps its checkpoints and metrics (its logs move to
        logs/previous-<time>/), `overwrite` clears everything lorarl wrote there. A `dry_run` makes
        the same checks and deletes nothing: it marks a new folder as a dry run's, which the next run
        reuses freely. `resume_from` gives the checkpoint step a resume continues from (`resume_step`),
        asked once the folder has passed its own checks (links, marker, the run's identity), so that a
        planted link or a renamed variant is named as such, not as a missing checkpoint; what the run
        wrote after that step is discarded (`discard_after`, for each of `variants`). Returns what was
        done, for the log; raises RunFolderError, having touched nothing, when the folder cannot be used
        as asked."""
        if resume and overwrite:
            raise RunFolderError("--resume continues a run and --overwrite starts it over: give one of them")
        if self.is_alive():
            raise RunFolderError(f"{self.root} belongs to a run that is still going: stop it, or pick another run_name")
        self._check_path()
        self._refuse_links()
        entries = list(self.root.iterdir()) if self.root.is_dir() else []
        marker = self._read_marker() if entries else None
        if entries and marker is None:
            raise RunFolderError(
                f"{self.root} is not empty and was not written by lorarl (no {MARKER}): it is left untouched; "
                "choose another output_dir or run_name"
            )
        previous = None if marker is None or marker.get("dry_run") else marker
        changes: list[str] = []
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
        if marker is not None:
            self._refuse_unwritten("--resume" if resume else "--overwrite" if overwrite else "a new run")
        identity = run_identity.record(config)  # reads the base model's files: once
        if resume and previous is not None:
            changes = self._resume_changes(previous, identity)
        said = f"; changed since the run started: {'; '.join(changes)}" if changes else ""
        step = resume_from() if resume_from is not None else None
        if step is not None and isinstance(max_steps := config.get("max_steps"), int) and step > max_steps:
            raise RunFolderError(
                f"--resume: max_steps = {max_steps} is below step {step}, the checkpoint the run continues from: "
                "raise max_steps to train on, or give --resume.step"
            )
        if dry_run:
            if marker is None:
                self._make_root()
                self._write_marker(kind, config, identity, None, dry_run=True)
            return f"dry run: {self.root} checked, nothing cleared{said}"
        if marker is not None:  # the folder is locked (is_alive above): no write of the run is under way
            self.remove_interrupted_checkpoint_writes()
        if resume:
            self.clear_regenerated()
            if step is not None:
                self.discard_after(step, variants)
            self._rotate_logs()
            done = f"resuming the {kind} run in {self.root}{said}"
        elif marker is not None:
            remove_written(self.root, _OUTPUTS)
            done = f"cleared the previous run's outputs in {self.root} (the files lorarl wrote there)"
        else:
            done = f"new run folder {self.root}"
        self._make_root()
        forget_missing(self.root)
        self._write_marker(kind, config, identity, previous if resume else None)
        return done

    def remove_interrupted_checkpoint_writes(self) -> None:
        """What checkpoint writes cut short (a kill, a full disk) left anywhere under checkpoints/,
        a variant's included; links are not followed. Only while no process of the run writes."""
        checkpoints = self.root / "checkpoints"
        if checkpoints.is_symlink():
            return
        for here, dirs, _ in os.walk(checkpoints):
            remove_interrupted_writes(Path(here))
            dirs[:] = [d for d in dirs if not _INTERRUPTED.match(d)]

    def _refuse_links(self) -> None:
        """Refuse, naming it, a symbolic link where lorarl writes, records or removes in this folder, or a
        record that is not a file: writing or clearing through one would reach someone else's files."""
        problem = record_problem(self.root)
        if problem is None and (links := links_under(self.root, (MARKER, LOCK, *_OUTPUTS))):
            problem = str(link_refusal(links[0]))
        if problem:
            raise RunFolderError(problem)

    def _check_path(self) -> None:
        """The run folder can be made and written (the rest, e.g. a file system that refuses even root,
        `_make_root` finds)."""
        if problem := unwritable(self.root):
            raise RunFolderError(f"{self.root}: {problem}: choose another output_dir or run_name")

    def _make_root(self) -> None:
        """Create the run folder and its record (the first thing written in a new one)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            record(self.root, [self.marker])
        except OSError as e:
            raise RunFolderError(
                f"{self.root}: cannot create the run folder ({e.strerror}): choose another output_dir"
            ) from None

    def _refuse_unwritten(self, flag: str) -> None:
        """Refuse, naming it, a file that lorarl did not write where the run would take it for its own."""
        if found := unwritten(self.root, _READ):
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise RunFolderError(
                f"{flag}: {found[0]}{more} was not written by lorarl (not in {self.root.name}/.lorarl-written) "
                "and would be taken for the run's own: move it out of the run folder, or choose another run_name"
            )

    def check_prepared(self, command: str) -> None:
        """`command` (the trainer or the orchestrator, run alone) writes only into a folder lorarl
        prepared for an `rl` run: one with its marker."""
        marker = self._read_marker()
        if marker is None:
            raise RunFolderError(
                f"{self.root} is not a run folder (no {MARKER}): {command} run alone writes only into one that "
                "`rl` prepared; run `rl --dry-run` with this config first, or check output_dir and run_name"
            )
        if marker.get("kind") != "rl":
            raise RunFolderError(
                f"{self.root} holds an `{marker.get('kind')}` run, not an `rl` run: {command} run alone writes only "
                "into a folder `rl` prepared; choose another run_name"
            )
        self._refuse_links()

    def hold_lock(self) -> None:
        """Mark the run alive for as long as this process lives (the lock goes with it, even on SIGKILL)."""
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        record(self.root, [self.root / LOCK])
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

    def discard_after(self, step: int, variants: Sequence[str] = ()) -> None:
        """Forget what the run wrote after `step`, which it continues from: later checkpoints (of each of
        `variants`, or of this view) and metrics rows of later steps, which the resumed run writes again.
        Call it before any process of the run starts: one that did it as it started would drop what the
        other had written meanwhile (a resumed orchestrator logs its first steps while the trainer loads)."""
        for view in [self.for_variant(v) for v in variants] or [self]:
            for later in (s for s in view.checkpoint_steps() if s > step):
                view.remove_checkpoint(later)
                log.info("removed checkpoint step_%d, written after the step resumed from", later)
        if self.metrics.is_file():
            lines = self.metrics.read_text().splitlines(keepends=True)
            write_file_atomically(self.metrics, "".join(line for line in lines if _row_step(line) <= step))

    def clear_regenerated(self) -> None:
        """Remove what a resumed run writes again from its checkpoint on (batches, adapters, samples):
        the files of them that lorarl wrote."""
        remove_written(self.root, _REGENERATED)

    def _read_marker(self) -> dict[str, Any] | None:
        if not self.marker.is_file():  # a FIFO would wait for a writer
            return None
        try:
            marker = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return None
        return marker if isinstance(marker, dict) and marker.get("lorarl") else None

    def _resume_changes(self, previous: dict[str, Any], identity: dict[str, Any]) -> list[str]:
        """What a resume changes that may change; raises RunFolderError for what may not (run_identity)."""
        refused, changed = run_identity.compare(previous, identity)
        if refused:
            raise RunFolderError(
                f"--resume: {self.root} was trained otherwise: {'; '.join(refused)}. A resume continues the "
                "same run: set these back, or start a new run (another run_name, or --overwrite)"
            )
        return changed

    def _write_marker(
        self,
        kind: str,
        config: dict[str, Any],
        identity: dict[str, Any],
        previous: dict[str, Any] | None,
        dry_run: bool = False,
    ) -> None:
        digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        marker = {
            "lorarl": 1,
            "kind": kind,
            "run_name": self.root.name,
            "config_hash": digest,
            "started": previous["started"] if previous else now,
            "resumed": [*previous.get("resumed", []), now] if previous else [],
            **({"dry_run": True} if dry_run else {}),
            **identity,  # run_identity.record(config)
        }
        write_file_atomically(self.marker, json.dumps(marker, indent=2) + "\n")

    def _rotate_logs(self) -> None:
        """Move the logs lorarl wrote to logs/previous-<time>/ (a user's stay where they are)."""
        mine = written_files(self.root)
        logs = [p for p in sorted(self.logs.glob("*.log")) if p in mine] if self.logs.is_dir() else []
        if logs:
            kept = self.logs / f"previous-{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}"
            kept.mkdir()
            for old in logs:
                old.rename(kept / old.name)
            record(self.root, [kept / old.name for old in logs])


def remove_interrupted_writes(folder: Path) -> None:
    """Delete the temporary folders in `folder` that writes cut short left (`.trainer.tmp-1234`:
    write_folder_atomically's, lorarl's by name, in a folder of lorarl's run; never read). Only
    while no write can be under way: at a start, or in a checkpoint being pruned. A folder moved
    aside (`.old-`) stays: it may be the only whole copy."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for entry in folder.iterdir():
        if _INTERRUPTED.match(entry.name) and entry.is_dir() and not entry.is_symlink():
            log.info("removing %s, left by a write that was cut short", entry)
            shutil.rmtree(entry)


def broadcast_version(folder: Path) -> tuple[str | None, int]:
    """The variant (None: the run's one adapter) and version of an adapter folder the run wrote,
    broadcasts/[<variant>/]step_N (RunFolder.broadcast)."""
    variant = folder.parent.name if folder.parent.name != "broadcasts" else None
    return variant, int(folder.name.removeprefix("step_"))


def step_folders(parent: Path) -> list[int]:
    """The N of every `step_N` entry in `parent` (none if it does not exist)."""
    if not parent.is_dir():
        return []
    return [int(m.group(1)) for p in parent.iterdir() if (m := _STEP.match(p.name))]


def unwritable(path: Path) -> str | None:
    """Why no folder can be made or written at `path`, found without writing: a file on its path, or
    its nearest existing folder not writable by this process; None when it looks writable."""
    if long := next((part for part in path.parts if len(os.fsencode(part)) > _NAME_MAX), None):
        return f"the name {long[:16]}... is longer than a file system allows ({_NAME_MAX} bytes)"
    try:
        existing = next(p for p in (path, *path.parents) if p.exists())
    except OSError as e:  # e.g. a folder on the path that this process may not search
        return f"{e.filename}: {e.strerror}"
    if dangling := next((p for p in (path, *path.parents) if p.is_symlink() and not p.exists()), None):
        return f"{dangling} is a symbolic link to {os.readlink(dangling)}, which does not exist"
    if not existing.is_dir():
        return f"{existing} is {'a file' if existing.is_file() else 'not a folder'}, not a folder to write in"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def write_folder_atomically(
    dest: Path, write: Callable[[Path], object], stable_marker: bool = False, checksums: bool = False
) -> None:
    """Run `write(tmp)` into a temporary sibling folder, make it durable (fsync), then rename it
    to `dest`. A folder already at `dest` is first renamed aside, so a reader (or a crash) sees the
    old folder, no folder, or the new one, never a mix.

    MANIFEST.json (every file and its size; with `checksums` its SHA-256 too) is written last: it is
    the record of the folder's files (written_files.py) and lets a reader verify the folder is whole
    (`manifest_problem`). With `stable_marker`, an empty `STABLE` file is added after the rename, for
    readers that poll for it (vLLM adapter loading). Files that the folder at `dest` held and lorarl
    did not write move into the new one; one that the new folder also has is refused (RunFolderError,
    nothing replaced), and so is a symbolic link at `dest` or on its path inside its folder.
    """
    refuse_link_on_path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # this process's own temporary, left by a crash
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        write_manifest(tmp, checksums)
    except Exception as e:  # nothing half-written stays behind; a full disk is said in one line
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(e.errno, _no_space(dest)) from e
        raise
    kept = _users_files(dest, tmp)
    _fsync_tree(tmp)
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    if stable_marker:
        (dest / STABLE).touch()
        _fsync(dest / STABLE)
    for name in kept:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(old / name, dest / name)
    _fsync(dest.parent)
    if old.exists():
        remove_folder(old)
    if (root := record_root(dest.parent)) is not None:
        record(root, [dest])


def _no_space(dest: Path) -> str:
    """The one line for a write of `dest` that the disk had no room for (its partial write removed)."""
    free = shutil.disk_usage(dest.parent).free
    return (
        f"no space left on the device of {dest.parent} ({free / 2**20:.1f} MiB free) to write {dest.name}; "
        "its partial write was removed: free space there (or lower trainer.ckpt.keep_last) and resume"
    )


def refuse_link_on_path(dest: Path) -> None:
    """RunFolderError, naming it, if `dest` or a folder on its path inside its folder is a symbolic link
    (`link_in_way`)."""
    if (link := link_in_way(dest)) is not None:
        raise RunFolderError(str(link_refusal(link)))


def _users_files(dest: Path, new: Path) -> list[Path]:
    """The files in the folder at `dest` that lorarl did not write, relative to it; RunFolderError
    (and `new` removed) if the new folder would replace one."""
    found = [p.relative_to(dest) for p in foreign_files(dest)] if dest.is_dir() else []
    if clash := next((name for name in found if (new / name).exists() or (new / name).is_symlink()), None):
        shutil.rmtree(new)
        raise RunFolderError(
            f"{dest / clash} was not written by lorarl (not in {dest.name}/{MANIFEST}) and would be replaced: "
            "it is left untouched; move it away, or write elsewhere"
        )
    return found


def _row_step(line: str) -> float:
    try:
        return float(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return float("inf")  # a line cut short by the crash the run resumes from


def write_file_atomically(dest: Path, text: str) -> None:
    """Write `text` to a temporary sibling, fsync it, then rename it over `dest`: a reader sees the
    old file or the new one, never a half-written one. The file goes into the folder's record; a link on
    its path is refused (`refuse_link_on_path`)."""
    refuse_link_on_path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)
    _fsync(tmp)
    os.replace(tmp, dest)
    _fsync(dest.parent)
    record_written(dest)


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
