"""`Relay`: with cluster.shared_fs = false, carries what the processes of a Ray run hand each other
between the nodes' own copies of the run folder, through Ray's object store.

Each node keeps its copy at `<cluster.node_dir>/<node id>/<run_name>/`. The trainer writes adapters
to its copy; the relay ships each complete one (a PEFT folder) to every inference node's copy, and
only then to the run folder where `rl` runs, whose `STABLE` is what makes the orchestrator load it
(from the worker's own copy: inference.worker_run_dirs). Rollout batches go the other way, from
the orchestrator's run folder to every trainer node; the trainer's metrics lines are appended to
the run's metrics.jsonl. Every folder lands under a temporary name and is renamed, as on one
machine, so no reader sees half of one. Adapters the orchestrator deleted are deleted on the
nodes too.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from pathlib import Path
from typing import Any

from lorarl.run_folder import STABLE, RunFolder, step_folders, write_folder_atomically
from lorarl.written_files import MANIFEST, remove_folder

log = logging.getLogger("lorarl.rl")


def _on(root: str) -> RunFolder:
    """The run folder at `root` on another node (its path there), which owns the names inside it."""
    return RunFolder(Path(root))


def read_folder(folder: str) -> dict[str, bytes]:
    """Every file of `folder` (an adapter, a batch), by path relative to it; STABLE and MANIFEST.json,
    which the writer adds, left out."""
    root = Path(folder)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and str(p.relative_to(root)) not in (STABLE, MANIFEST)
    }


def write_folder(dest: str, files: dict[str, bytes], stable: bool) -> None:
    """Write `files` as the folder `dest`, atomically (and with STABLE last for an adapter)."""

    def write(tmp: Path) -> None:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)

    write_folder_atomically(Path(dest), write, stable_marker=stable)


def stable_steps(parent: str) -> list[int]:
    """The steps of the complete adapters under `parent` (broadcasts/)."""
    return [s for s in step_folders(Path(parent)) if (Path(parent) / f"step_{s}" / STABLE).exists()]


def read_lines(path: str, offset: int) -> tuple[bytes, int]:
    """The whole lines of `path` after byte `offset`, and the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return b"", offset
    whole = data[: data.rfind(b"\n") + 1]
    return whole, offset + len(whole)


def write_file(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def remove(path: str) -> None:
    remove_folder(Path(path))  # the files lorarl wrote in it


class Relay:
    """Runs in `rl`'s process, in a thread of its own, while the run goes. `trainer`: the host actor of
    trainer rank 0 and its node's run folder; `inference` and `trainers`: (actor, run folder) of each
    node that reads adapters (vLLM) or batches (trainer ranks), each node once."""

    def __init__(
        self,
        run: RunFolder,
        trainer: tuple[Any, str],
        inference: list[tuple[Any, str]],
        trainers: list[tuple[Any, str]],
        keep_rollouts: bool,
    ) -> None:
        self.run, self.trainer, self.inference, self.trainers = run, trainer, inference, trainers
        self.keep_rollouts = keep_rollouts
        self.adapters: set[int] = set()  # shipped everywhere
        self.batches: set[int] = set()
        self.metrics_offset = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread after its current pass, then make a last one (the final metrics)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.error is None:
            self._guarded()

    def _loop(self) -> None:
        while not self._stop.is_set() and self.error is None:
            self._guarded()
            self._stop.wait(0.2)

    def _guarded(self) -> None:
        try:
            self.relay()
        except Exception as e:  # a lost node, a full disk: the run stops with this as the relay's log
            self.error = f"{type(e).__name__}: {e}"
            self.run.logs.mkdir(parents=True, exist_ok=True)
            (self.run.logs / "relay.log").write_text(traceback.format_exc())

    def relay(self) -> None:
        import ray

        host, root = self.trainer
        trainer = _on(root)  # the trainer node's copy of the run folder
        for step in sorted(set(ray.get(host.call.remote(stable_steps, str(trainer.broadcasts)))) - self.adapters):
            files = host.call.remote(read_folder, str(trainer.broadcast(step)))  # stays in the object store
            ray.get([h.call.remote(write_folder, str(_on(r).broadcast(step)), files, True) for h, r in self.inference])
            write_folder(str(self.run.broadcast(step)), ray.get(files), stable=True)  # the orchestrator sees it now
            self.adapters.add(step)
        for step in sorted(self.adapters - set(step_folders(self.run.broadcasts))):
            # The orchestrator deleted it (orchestrator.delete_old_broadcasts): so do the nodes.
            ray.get([h.call.remote(remove, str(_on(r).broadcast(step))) for h, r in [self.trainer, *self.inference]])
            self.adapters.discard(step)
        for step in sorted(set(step_folders(self.run.rollouts_folder)) - self.batches):
            batch = read_folder(str(self.run.rollouts(step)))
            ray.get([h.call.remote(write_folder, str(_on(r).rollouts(step)), batch, False) for h, r in self.trainers])
            self.batches.add(step)
            if not self.keep_rollouts:  # the trainer deletes its node's copy once trained on
                remove(str(self.run.rollouts(step)))
        lines, self.metrics_offset = ray.get(host.call.remote(read_lines, str(trainer.metrics), self.metrics_offset))
        if lines:
            with open(self.run.metrics, "ab") as f:
                f.write(lines)
                f.flush()
                os.fsync(f.fileno())
