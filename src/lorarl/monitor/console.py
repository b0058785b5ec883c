"""`StepPrinter`: follows metrics.jsonl and prints one line per finished trainer step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class StepPrinter:
    def __init__(self, path: Path, max_steps: int) -> None:
        self.path, self.max_steps = path, max_steps
        self._offset = 0
        self._orchestrator: dict[int, dict[str, Any]] = {}

    def poll(self) -> list[str]:
        """Lines for the trainer steps logged since the last call."""
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self._offset)
            chunk = f.read()
        # Only whole lines: the writer may be half-way through one.
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete.encode())
        out = []
        for line in complete.splitlines():
            row = json.loads(line)
            if row["component"] == "orchestrator":
                self._orchestrator[row["step"]] = row
            elif row["component"] == "trainer":
                out.append(self.format(row, self._orchestrator.pop(row["step"], {})))
        return out

    def format(self, trainer: dict[str, Any], orch: dict[str, Any]) -> str:
        def get(row: dict[str, Any], key: str, fmt: str) -> str:
            value = row.get(key)
            return "-" if value is None else format(value, fmt)

        # Only under continuous batching (orchestrator.max_off_policy_steps) are groups ever dropped.
        dropped = f" | dropped {orch['dropped/groups']}" if orch.get("dropped/groups") else ""
        return (
            f"step {trainer['step']:>4}/{self.max_steps}"
            f" | reward {get(orch, 'reward/mean', '.3f')}"
            f" | len {get(orch, 'completion_len/mean', '.1f')}"
            f" | lag {get(trainer, 'policy_lag/mean', '.1f')}"
            f" | loss {get(trainer, 'loss', '+.4f')}"
            f" | |dlogp| {get(trainer, 'mismatch/logprob_abs_diff', '.1e')}"
            f" | grad {get(trainer, 'grad_norm', '.3f')}"
            f"{dropped} | {get(trainer, 'time/step', '.1f')} s"
        )
