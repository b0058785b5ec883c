"""The progress watchdog of `rl`'s supervision loop: a run with no new step says, in one line, which
process it waits on and for how long, and stops after `monitor.stall_stop` seconds.

A frozen trainer, a vLLM worker that stopped answering, a reward function that never returns: each
leaves every process alive, so exit codes never show it. What does show is that metrics.jsonl gets
no new step. The step rows tell whom the run waits on: an orchestrator row ahead of the trainer's
means its batch is ready and the trainer has not finished it; otherwise the orchestrator has not
made the next batch (its workers, environments or rewards), except before the trainer has written
the starting policy, which the orchestrator needs to sample at all: the trainer is still loading the
model (minutes for a large one), and the line says so. The waited-on process's log says the rest,
so the line quotes its age and last line (inference/pool.py names a stalled worker there,
orchestrator/reward_calls.py the oldest running reward call).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class StallWatch:
    """`steps(latest)` after each poll of the metrics; `check` says what to log, and whether to stop."""

    warning_s: float
    stop_s: float | None
    log_of: Callable[[str], tuple[Path, str]]  # a role's log path and its last lines
    clock: Callable[[], float] = time.monotonic
    policy_written: Callable[[], bool] = lambda: True  # whether the trainer has written a policy to sample
    _latest: dict[str, int] = field(default_factory=dict)
    _since: float = 0.0
    _warned: float = 0.0

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """The run (re)started its trainer and orchestrator: the wait counts from now."""
        self._since = self._warned = self.clock()

    def steps(self, latest: dict[str, int]) -> None:
        """The newest step of each component so far (StepPrinter.latest); a newer one than before is
        progress."""
        if any(step > self._latest.get(component, -1) for component, step in latest.items()):
            self._since = self._warned = self.clock()
        self._latest = dict(latest)

    def check(self) -> tuple[str | None, bool]:
        """(a line to log, or None; whether to stop the run)."""
        waited = self.clock() - self._since
        if self.stop_s is not None and waited >= self.stop_s:
            return f"{self.waiting(waited)}; stopping the run (monitor.stall_stop {self.stop_s:g} s)", True
        if self.clock() - self._warned >= self.warning_s:
            self._warned = self.clock()
            return f"{self.waiting(waited)} (monitor.stall_warning {self.warning_s:g} s)", False
        return None, False

    def waiting(self, waited: float) -> str:
        trainer, orchestrator = self._latest.get("trainer", 0), self._latest.get("orchestrator", 0)
        if orchestrator > trainer:
            role, what = "trainer", f"step {trainer + 1} (its batch is ready)"
        elif not self.policy_written():
            role, what = "trainer", "the starting policy (it loads the model, then writes it)"
        else:
            role, what = "orchestrator", f"the batch of step {orchestrator + 1}"
        return f"no step for {_duration(waited)}: waiting on the {role} for {what}; {self._log_line(role)}"

    def _log_line(self, role: str) -> str:
        path, tail = self.log_of(role)
        try:
            age = f"last written {_duration(time.time() - path.stat().st_mtime)} ago"
        except OSError:
            age = "not found"
        last = tail.strip().splitlines()[-1].strip() if tail.strip() else ""
        return f"its log {path} {age}" + (f": {last}" if last else "")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
