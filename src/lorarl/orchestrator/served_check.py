"""The served-adapter check (docs/served_check.md): is each worker serving the version the
trainer wrote?

The most common silent failure of LoRA RL is sampling from a policy other than the one trained: an
adapter that did not load, a worker serving the base model, a stale version under a reused name,
another base model. The logprob gap of the trained tokens hides these behind the policy's own change
(max_async_level >= 1). So each version is checked on each worker before any of its rollouts go
there: the worker scores the trainer's probe (trainer/served_probe.py, written beside the adapter) through
the served adapter name with vLLM's prompt logprobs, and per token
* served vs trainer: max |Δ logprob| must be within the tolerance (it follows the dtype);
* served vs base: where the trainer's version differs from the base model, a worker whose logprobs
  equal the base's is named as "serving the base model".
A failing worker is reloaded once and checked again; then the run stops in one line
(`ServedCheckFailed`), or with "warn" the line is logged and the worker is left out of that
version's rollouts (WorkerPool.exclude). Each version's figures go to metrics.jsonl as component
"served", step = version (a variant's rows stamped with its name): served/probe_gap (max over
workers), served/vs_base (min over workers: the one closest to the base), served/check_s (seconds,
summed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lorarl.inference.client import InferenceClient, InferenceError
from lorarl.monitor.metrics import MetricsLogger
from lorarl.run_folder import PROBE_FILE, broadcast_version

log = logging.getLogger("lorarl.orchestrator")

# |Δ logprob| a worker may differ from the trainer by on any probe token, by model.dtype: fp32 on the
# CPU agrees to ~1e-6 here but 1.7e-3 on CI's CPUs (a tiny model with large logits), while one step
# moves the probe by 0.1-0.2; bf16/fp16 kernels (vLLM's vs the trainer's) differ by up to ~0.1-0.3.
TOLERANCE = {"float32": 1e-2, "bfloat16": 0.25, "float16": 0.25}

ExcludeFn = Callable[[InferenceClient, str], None]


class ServedCheckFailed(InferenceError):
    """A worker failed the check after a reload; str() is the one line `rl` shows."""


@dataclass(frozen=True)
class Gaps:
    """Max |Δ logprob| over the probe's tokens between served, trainer and base."""

    served_trainer: float
    served_base: float
    trainer_base: float

    def problem(self, tolerance: float) -> str | None:
        """What is wrong, or None if the worker serves the trainer's version."""
        if self.served_trainer <= tolerance:
            return None
        if self.served_base <= tolerance < self.trainer_base:
            return "the worker is serving the base model"
        return "the worker serves other weights than the trainer's"

    def figures(self) -> str:
        return (
            f"max |Δlogp| vs trainer {self.served_trainer:.3g}, vs base {self.served_base:.3g} "
            f"(trainer vs base {self.trainer_base:.3g})"
        )


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest |a - b| over every token of every sequence; inf if the shapes differ."""
    if [len(s) for s in a] != [len(s) for s in b]:
        return float("inf")
    return max((abs(x - y) for sa, sb in zip(a, b, strict=True) for x, y in zip(sa, sb, strict=True)), default=0.0)


def compare(served: list[list[float]], trainer: list[list[float]], base: list[list[float]]) -> Gaps:
    return Gaps(max_abs_diff(served, trainer), max_abs_diff(served, base), max_abs_diff(trainer, base))


def tolerance_for(configured: float | None, dtype: str) -> float:
    """inference.served_check_tolerance, or the dtype's default."""
    return configured if configured is not None else TOLERANCE[dtype]


def read_probe_file(folder: Path) -> dict[str, Any] | None:
    """The probe in a broadcast folder, or None if its version was written without one."""
    path = folder / PROBE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


async def served_logprobs(worker: InferenceClient, name: str, sequences: list[list[int]]) -> list[list[float]]:
    """log p(token | tokens before it) of every token but the first of each sequence, as `worker`
    serves the model `name` (one request per sequence, sent together)."""
    return list(await asyncio.gather(*(worker.prompt_logprobs(name, ids) for ids in sequences)))


@dataclass
class _Version:
    """A version's checks so far, one per worker."""

    gap: float = 0.0
    vs_base: float = float("inf")
    seconds: float = 0.0


class ServedCheck:
    """The check the pool runs on a worker after loading an adapter (WorkerPool.served_check)."""

    def __init__(
        self,
        mode: Literal["stop", "warn"],
        tolerance: float,
        metrics: Callable[[str | None], MetricsLogger],
        exclude: ExcludeFn,
    ) -> None:
        """`metrics(variant)`: the logger of a variant's rows (None: the run's one adapter), made once;
        `exclude(worker, name)`: leave the worker out of the adapter's rollouts ("warn")."""
        self.mode, self.tolerance, self.exclude = mode, tolerance, exclude
        self._new_logger, self._loggers = metrics, dict[str | None, MetricsLogger]()
        self._pending: dict[tuple[str | None, int], _Version] = defaultdict(_Version)

    async def __call__(self, worker: InferenceClient, name: str, path: str) -> None:
        """Check `worker` serving adapter `name` loaded from `path`; reload once if it fails."""
        folder = Path(path)
        probe = read_probe_file(folder)
        if probe is None:  # written without one: a trainer with served_check "off"
            return
        (variant, version), start = broadcast_version(folder), time.perf_counter()
        gaps = await self._gaps(worker, name, probe)
        if gaps.problem(self.tolerance) is not None:
            log.warning("%s, version %d: %s; reloading it once", worker.base_url, version, gaps.figures())
            await worker.unload_adapter(name)
            await worker.load_adapter(name, path)
            gaps = await self._gaps(worker, name, probe)
        self._record(variant, version, gaps, time.perf_counter() - start)
        if (problem := gaps.problem(self.tolerance)) is not None:
            line = (
                f"served-adapter check failed: {worker.base_url} serving {name}, version {version}: {problem}: "
                f"{gaps.figures()}, tolerance {self.tolerance:g} (inference.served_check_tolerance)"
            )
            if self.mode == "stop":
                self.flush()
                raise ServedCheckFailed(line)
            log.error("%s; its rollouts go to the other workers", line)
            self.exclude(worker, name)

    async def _gaps(self, worker: InferenceClient, name: str, probe: dict[str, Any]) -> Gaps:
        served = await served_logprobs(worker, name, probe["sequences"])
        return compare(served, probe["logprobs"], probe["base"])

    def _record(self, variant: str | None, version: int, gaps: Gaps, seconds: float) -> None:
        row = self._pending[variant, version]
        row.gap = max(row.gap, gaps.served_trainer)
        row.vs_base = min(row.vs_base, gaps.served_base)
        row.seconds += seconds

    def flush(self) -> None:
        """Log the versions checked since the last call, one metrics row each."""
        for (variant, version), row in self._pending.items():
            if variant not in self._loggers:
                self._loggers[variant] = self._new_logger(variant)
            figures = {"served/probe_gap": row.gap, "served/vs_base": row.vs_base, "served/check_s": row.seconds}
            self._loggers[variant].log(version, figures)
        self._pending.clear()
