"""`MetricsLogger`: one JSON object per line in metrics.jsonl, optionally mirrored to wandb, where
tables (a step's samples) go too."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from lorarl.config.run import MonitorConfig
from lorarl.written_files import record_written


class MetricsLogger:
    def __init__(
        self, path: Path, component: str, monitor: MonitorConfig, run_name: str, variant: str | None = None
    ) -> None:
        """`variant`: the [[variants]] adapter whose metrics these are, stamped on every row (and the
        wandb run's name); None: the run's one adapter."""
        self.path, self.component, self.monitor, self.variant = path, component, monitor, variant
        self._wandb: Any = None
        if monitor.jsonl:
            record_written(path)  # lorarl's file: a clean-up may remove it
        if monitor.wandb is not None and monitor.wandb.mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project=monitor.wandb.project,
                mode=monitor.wandb.mode,
                group=run_name,
                name=f"{run_name}-{component}" if variant is None else f"{run_name}-{variant}-{component}",
                dir=str(path.parent),
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        stamp = {} if self.variant is None else {"variant": self.variant}
        row = {"step": step, "component": self.component, **stamp, "time": time.time(), **_finite(metrics)}
        if self.monitor.jsonl:
            # One write of one line with O_APPEND: trainer and orchestrator share the file safely.
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.log({f"{self._prefix}/{k}": v for k, v in metrics.items()}, step=step)

    def log_table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        """Log `rows` (e.g. a step's samples) to wandb as the table `<component>/<name>`, one column
        per key of any row. Without wandb, nothing: metrics.jsonl holds numbers only."""
        if self._wandb is None or not rows:
            return
        import wandb

        columns = list(dict.fromkeys(key for row in rows for key in row))
        data = [[_cell(row.get(column)) for column in columns] for row in rows]
        table = wandb.Table(columns=[*columns], data=data)  # a copy: its stubs take list[str | int]
        self._wandb.log({f"{self._prefix}/{name}": table}, step=step)

    @property
    def _prefix(self) -> str:
        # A process's loggers share one wandb run (wandb.init returns the running one): a sweep's
        # variants keep their keys apart, `<variant>/<component>/<metric>`.
        return self.component if self.variant is None else f"{self.variant}/{self.component}"

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()


def _finite(metrics: dict[str, float]) -> dict[str, float | None]:
    # JSON has no NaN: write null so every reader can parse the file.
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


def _cell(value: Any) -> Any:
    """A table cell: scalars as they are; a chat (a list of {"role", "content"} messages) as its
    turns one after another, readable in the wandb UI; anything else as JSON."""
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in value):
        return "\n\n".join(f"{m['role']}: {m['content']}" for m in value)
    return json.dumps(value)
