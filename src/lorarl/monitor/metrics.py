"""`MetricsLogger`: one JSON object per line in metrics.jsonl, optionally mirrored to wandb."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from lorarl.config.models import MonitorConfig


class MetricsLogger:
    def __init__(self, path: Path, component: str, monitor: MonitorConfig, run_name: str) -> None:
        self.path, self.component, self.monitor = path, component, monitor
        self._wandb: Any = None
        if monitor.wandb is not None and monitor.wandb.mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project=monitor.wandb.project,
                mode=monitor.wandb.mode,
                group=run_name,
                name=f"{run_name}-{component}",
                dir=str(path.parent),
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, "component": self.component, "time": time.time(), **_finite(metrics)}
        if self.monitor.jsonl:
            # One write of one line with O_APPEND: trainer and orchestrator share the file safely.
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.log({f"{self.component}/{k}": v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()


def _finite(metrics: dict[str, float]) -> dict[str, float | None]:
    # JSON has no NaN: write null so every reader can parse the file.
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
