"""The progress watchdog's own logic (launcher/stall_watch.py) on a clock the test moves; the run it
guards is tested in tests/integration/test_faults_processes.py (a frozen trainer)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from lorarl.launcher.stall_watch import StallWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch(tmp_path: Path, clock: Clock, stop: float | None = 600) -> StallWatch:
    logs = {role: tmp_path / f"{role}.log" for role in ("trainer", "orchestrator")}
    logs["trainer"].write_text("step 3 done\nloading the batch of step 4\n")
    os.utime(logs["trainer"], (time.time() - 240, time.time() - 240))
    return StallWatch(60, stop, lambda role: (logs[role], logs[role].read_text() if logs[role].exists() else ""), clock)


def test_no_step_for_the_warning_time_names_the_trainer_its_step_and_its_log(tmp_path: Path) -> None:
    clock = Clock()
    w = watch(tmp_path, clock)
    w.steps({"trainer": 3, "orchestrator": 4})
    clock.now += 59
    assert w.check() == (None, False)
    clock.now += 1
    said, stop = w.check()
    assert not stop and said is not None and "\n" not in said
    assert said.startswith("no step for 60 s: waiting on the trainer for step 4 (its batch is ready); its log ")
    assert said.endswith("trainer.log last written 4 min ago: loading the batch of step 4 (monitor.stall_warning 60 s)")
    clock.now += 30
    assert w.check() == (None, False)  # said again a warning period later, not on every poll
    clock.now += 30
    said, _ = w.check()
    assert said is not None and said.startswith("no step for 2 min: waiting on the trainer")


def test_the_orchestrator_is_named_while_the_next_batch_is_not_made(tmp_path: Path) -> None:
    clock = Clock()
    w = watch(tmp_path, clock)
    w.steps({"trainer": 3, "orchestrator": 3})
    clock.now += 61
    said, _ = w.check()
    assert said is not None and "waiting on the orchestrator for the batch of step 4; its log " in said
    assert "orchestrator.log not found" in said  # no log yet: said, not a traceback


def test_before_the_starting_policy_is_written_the_trainer_loading_the_model_is_named(tmp_path: Path) -> None:
    """No step yet and no policy to sample: the orchestrator waits on the trainer, not the other way."""
    clock, written = Clock(), [False]
    w = watch(tmp_path, clock)
    w.policy_written = lambda: written[0]
    w.steps({})
    clock.now += 60
    said, _ = w.check()
    assert said is not None and "waiting on the trainer for the starting policy (it loads the model" in said
    written[0] = True
    clock.now += 60
    said, _ = w.check()
    assert said is not None and "waiting on the orchestrator for the batch of step 1" in said


def test_a_new_step_resets_the_wait_and_the_stop_comes_after_stall_stop(tmp_path: Path) -> None:
    clock = Clock()
    w = watch(tmp_path, clock)
    w.steps({"trainer": 1, "orchestrator": 2})
    clock.now += 500
    w.steps({"trainer": 2, "orchestrator": 2})  # progress
    clock.now += 599
    assert w.check()[1] is False
    clock.now += 1
    said, stop = w.check()
    assert stop and said is not None and said.endswith("; stopping the run (monitor.stall_stop 600 s)")
    assert "no step for 10 min" in said


def test_without_stall_stop_the_run_is_never_stopped_and_a_restart_counts_anew(tmp_path: Path) -> None:
    clock = Clock()
    w = watch(tmp_path, clock, stop=None)
    clock.now += 10_000
    assert w.check()[1] is False
    w.restart()
    clock.now += 59
    assert w.check() == (None, False)
