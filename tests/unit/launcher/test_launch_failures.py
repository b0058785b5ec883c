"""What `rl` does when its trainer or orchestrator exits with an error (launch.py): a crash is restarted
from the latest whole checkpoint (auto_resume); an end that a restart would repeat (a refusal, training
stopped) is not, and the run stops with its one line. Real processes and a real run folder."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from lorarl.config.run import RLConfig
from lorarl.exit_codes import BAD_INPUT, DISK_FULL, TRAINING_STOPPED
from lorarl.launcher.launch import auto_resume_step, report_failure
from lorarl.launcher.plan import ProcessSpec, Role
from lorarl.launcher.supervisor import Supervisor
from lorarl.run_folder import RunFolder

REASON = "step 2: the update made weights NaN or infinite (lr 1e+06); lower trainer.optim.lr and start again"


def config() -> RLConfig:
    return RLConfig(model={"name": "a-model"})


@pytest.fixture
def run(tmp_path: Path) -> RunFolder:
    """A run folder with a whole checkpoint at step 1."""
    folder = RunFolder(tmp_path / "run").create()
    for half in ("orchestrator", "trainer"):
        folder.write_checkpoint_half(1, half, lambda d: (d / "state.json").write_text('{"step": 1}'))
    return folder


def ended(sup: Supervisor, name: Role, code: int) -> int:
    """Run a process `name` that logs a line of progress, then its reason, and exits with `code`."""
    lines = f"print('step 1 done', file=sys.stderr); print('error: {REASON}', file=sys.stderr)"
    script = f"import sys; {lines}; sys.exit({code})"
    sup.start(ProcessSpec(name, [sys.executable, "-c", script], role=name)).wait()
    failed = sup.failed()
    assert failed == (name, code)
    return failed[1]


@pytest.mark.parametrize("code", [1, -9])  # a Python error; a kill -9
def test_a_crash_resumes_from_the_latest_whole_checkpoint_while_restarts_last(run: RunFolder, code: int) -> None:
    cfg = config()
    assert auto_resume_step(cfg, run, code, restarts=0, allowed=2) == 1
    assert auto_resume_step(cfg, run, code, restarts=1, allowed=2) == 1
    assert auto_resume_step(cfg, run, code, restarts=2, allowed=2) is None  # used up
    assert auto_resume_step(cfg, run, code, restarts=0, allowed=0) is None  # auto_resume off


def test_a_crash_without_a_whole_checkpoint_is_not_resumed(tmp_path: Path) -> None:
    empty = RunFolder(tmp_path / "new").create()
    assert auto_resume_step(config(), empty, 1, restarts=0, allowed=2) is None


@pytest.mark.parametrize("code", [TRAINING_STOPPED, BAD_INPUT, DISK_FULL])
def test_an_end_that_a_restart_would_repeat_stops_the_run_in_its_one_line(
    run: RunFolder, sup: Supervisor, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    assert auto_resume_step(config(), run, code, restarts=0, allowed=2) is None
    with caplog.at_level(logging.ERROR, logger="lorarl.rl"):
        assert report_failure(sup, "trainer", ended(sup, "trainer", code)) == code  # rl's own exit code
    assert caplog.messages == [f"trainer: {REASON}"]


def test_any_other_failure_shows_the_tail_of_the_log(sup: Supervisor, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="lorarl.rl"):
        assert report_failure(sup, "orchestrator", ended(sup, "orchestrator", 1)) == 1
    (message,) = caplog.messages
    assert message.startswith("orchestrator exited with code 1; stopping the run") and "step 1 done" in message


def test_a_stop_whose_log_is_gone_says_so_and_how_the_process_ended(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The run folder deleted mid-run: no last lines to show, so the one line says the cause."""
    sup = Supervisor(tmp_path / "run" / "logs")
    proc = sup.start(
        ProcessSpec("orchestrator", [sys.executable, "-c", "import time; time.sleep(60)"], role="orchestrator")
    )
    sup.log_path("orchestrator").unlink()
    proc.kill()
    proc.wait()
    with caplog.at_level(logging.ERROR, logger="lorarl.rl"):
        assert report_failure(sup, "orchestrator", proc.returncode) == 1
    assert caplog.messages == [
        f"orchestrator was killed by SIGKILL; stopping the run. Its log {sup.log_path('orchestrator')} is gone "
        "(was the run folder deleted?)"
    ]
