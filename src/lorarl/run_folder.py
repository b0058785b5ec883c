"""The run folder (`output_dir/run_name/`): one place that knows its layout.

configs/  logs/  rollouts/step_N/  broadcasts/step_N/  metrics.jsonl  samples/step_N.jsonl

Folders that another process reads are written under a temporary name and renamed, and adapter
folders get `STABLE` last, so a reader never sees a half-written step.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

STABLE = "STABLE"
_STEP = re.compile(r"^step_(\d+)$")


class RunFolder:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    configs = property(lambda self: self.root / "configs")
    logs = property(lambda self: self.root / "logs")
    metrics = property(lambda self: self.root / "metrics.jsonl")

    def rollouts(self, step: int) -> Path:
        return self.root / "rollouts" / f"step_{step}"

    def broadcast(self, step: int) -> Path:
        return self.root / "broadcasts" / f"step_{step}"

    def samples(self, step: int) -> Path:
        return self.root / "samples" / f"step_{step}.jsonl"

    def latest_stable_broadcast(self) -> int | None:
        """The highest step whose adapter folder is complete, or None."""
        steps = [s for s in step_folders(self.root / "broadcasts") if (self.broadcast(s) / STABLE).exists()]
        return max(steps, default=None)

    def create(self) -> RunFolder:
        for d in (self.configs, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        return self


def step_folders(parent: Path) -> list[int]:
    """The N of every `step_N` entry in `parent` (none if it does not exist)."""
    if not parent.is_dir():
        return []
    return [int(m.group(1)) for p in parent.iterdir() if (m := _STEP.match(p.name))]


def write_folder_atomically(dest: Path, write: Callable[[Path], object], stable_marker: bool = False) -> None:
    """Run `write(tmp)` into a temporary sibling folder, then rename it to `dest`.

    With `stable_marker`, an empty `STABLE` file is added after everything else, for readers that
    poll for it (vLLM adapter loading).
    """
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    if stable_marker:
        (dest / STABLE).touch()
