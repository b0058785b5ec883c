"""`StepPrinter`: follows metrics.jsonl and prints one line per finished trainer step (of a sweep,
per variant, named first).

It runs inside `rl`'s supervision loop, so no metrics line may ever stop it: a resumed trainer
replaces the file (rows after its checkpoint dropped), a crash can leave a line cut short, and a
user may open the file in an editor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class StepPrinter:
    def __init__(self, path: Path, max_steps: int) -> None:
        self.path, self.max_steps = path, max_steps
        self._offset = 0
        self._file_id: tuple[int, int] | None = None  # (device, inode) of the file read so far
        # Keyed by (variant, step): a sweep ([[variants]]) logs each step once per variant; None: no variants.
        self._printed: set[tuple[str | None, int]] = set()
        self._orchestrator: dict[tuple[str | None, int], dict[str, Any]] = {}
        # Per variant, the newest version's served-adapter check (served_check.py).
        self._served: dict[str | None, dict[str, Any]] = {}
        # The newest step of the trainer and the orchestrator (any variant): the progress watchdog's.
        self.latest: dict[str, int] = {}

    def poll(self) -> list[str]:
        """Lines for the trainer steps logged since the last call."""
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                if (stat.st_dev, stat.st_ino) != self._file_id or stat.st_size < self._offset:
                    self._file_id, self._offset = (stat.st_dev, stat.st_ino), 0  # replaced: read it anew
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        # Only whole lines: the writer may be half-way through one.
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        out = []
        for row in filter(None, map(_parse, complete.splitlines())):
            key = (row.get("variant"), row["step"])
            if row["component"] in ("trainer", "orchestrator"):
                self.latest[row["component"]] = max(row["step"], self.latest.get(row["component"], -1))
            if row["component"] == "orchestrator":
                self._orchestrator[key] = row
            elif row["component"] == "served" and row["step"] >= self._served.get(key[0], {}).get("step", -1):
                self._served[key[0]] = row
            elif row["component"] == "trainer" and key not in self._printed:
                self._printed.add(key)
                out.append(self.format(row, self._orchestrator.pop(key, {})))
        return out

    def format(self, trainer: dict[str, Any], orch: dict[str, Any]) -> str:
        def get(row: dict[str, Any], key: str, fmt: str) -> str:
            value = row.get(key)
            return "-" if value is None else format(value, fmt)

        # Only under continuous batching (orchestrator.max_off_policy_steps) are groups ever dropped.
        dropped = f" | dropped {orch['dropped/groups']}" if orch.get("dropped/groups") else ""
        # Workers that stopped answering in time this step (inference.request_timeout): the step was slow.
        stalls = f" | stalled workers {orch['inference/stalls']}" if orch.get("inference/stalls") else ""
        variant = f"{trainer['variant']} " if trainer.get("variant") else ""
        return (
            f"{variant}step {trainer['step']:>4}/{self.max_steps}"
            f" | reward {get(orch, 'reward/mean', '.3f')}"
            f" | len {get(orch, 'completion_len/mean', '.1f')}"
            f" | lag {get(trainer, 'policy_lag/mean', '.1f')}"
            f" | loss {get(trainer, 'loss', '+.4f')}"
            f" | |dlogp| {get(trainer, 'mismatch/logprob_abs_diff', '.1e')}"
            f" | served {get(self._served.get(trainer.get('variant'), {}), 'served/probe_gap', '.0e')}"
            f" | grad {get(trainer, 'grad_norm', '.3f')}"
            f"{dropped}{stalls} | {get(trainer, 'time/step', '.1f')} s"
        )


def _parse(line: bytes) -> dict[str, Any] | None:
    """A metrics row, or None for anything else (a line cut short by a crash, a stray edit)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) and "component" in row else None
