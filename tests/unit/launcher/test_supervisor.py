"""The `Supervisor` stops whole process groups: what a dead leader left in its group (as vLLM's engine
core outlives its server) is stopped before a restart and when the run ends. Real processes."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from lorarl.launcher.plan import ProcessSpec
from lorarl.launcher.supervisor import Supervisor, group_members

# A leader that starts a member of its group, which ignores SIGTERM if asked, and says its pid.
LEADER = """
import subprocess, sys, time
member = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(member.pid, flush=True)
time.sleep(600)
"""
MEMBER = "import signal, time\n{}time.sleep(600)"


def leader(name: str, deaf: bool = False) -> ProcessSpec:
    member = MEMBER.format("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if deaf else "")
    return ProcessSpec(name, [sys.executable, "-c", LEADER, member], role="trainer")


def member_pid(sup: Supervisor, name: str) -> int:
    deadline = time.monotonic() + 30
    while not (text := sup.log_path(name).read_text().strip()):
        assert time.monotonic() < deadline, "the leader did not start its member"
        time.sleep(0.05)
    return int(text.splitlines()[-1])


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_restart_first_stops_what_the_dead_leader_left(sup: Supervisor, caplog: pytest.LogCaptureFixture) -> None:
    first = sup.start(leader("inference-0"))
    orphan = member_pid(sup, "inference-0")
    os.kill(first.pid, signal.SIGKILL)  # as `kill -9` of vLLM's server
    first.wait()
    assert running(orphan) and sup.failed() == ("inference-0", -9)
    assert [p.pid for p in group_members(first.pid)] == [orphan]  # the group outlives its leader
    second = sup.start(leader("inference-0"))
    assert not running(orphan)
    assert "inference-0: stopped 1 process(es) its previous run left in its process group" in caplog.text
    assert second.poll() is None and sup.failed() is None


@pytest.mark.slow
def test_a_member_deaf_to_sigterm_is_killed_after_the_grace_period(sup: Supervisor) -> None:
    proc = sup.start(leader("trainer", deaf=True))
    member = member_pid(sup, "trainer")
    assert sup.stop(["trainer"], grace=1) == 0  # its leader was alive: nothing was left behind
    assert proc.returncode == -signal.SIGTERM and not running(member)
    assert not group_members(proc.pid)


def test_stop_all_reaches_the_group_of_a_leader_already_gone(sup: Supervisor) -> None:
    proc = sup.start(leader("inference-1"))
    orphan = member_pid(sup, "inference-1")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    sup.stop_all(grace=5)
    assert not running(orphan)


def test_a_finished_run_leaves_its_log_and_no_group(sup: Supervisor) -> None:
    proc = sup.start(ProcessSpec("orchestrator", [sys.executable, "-c", "print('done')"], role="orchestrator"))
    assert proc.wait(timeout=30) == 0 and sup.finished(["orchestrator"])
    assert sup.stop(["orchestrator"], grace=1) == 0
    assert sup.tail("orchestrator") == "done\n"


def test_the_tail_of_a_worker_leaves_out_vllms_route_listing(sup: Supervisor) -> None:
    """A worker that fails soon after its start: the cause, not the 39 routes vLLM lists at its start."""
    routes = "".join(
        f"(APIServer pid=7) INFO 12-06 03:22:48 [launcher.py:195] Route: /v1/r{i}, Methods: GET\n" for i in range(39)
    )
    log = "started\n" + routes + "CUDA out of memory\n"
    script = f"import sys; sys.stdout.write({log!r})"
    sup.start(ProcessSpec("inference-0", [sys.executable, "-c", script], role="inference")).wait(timeout=30)
    assert sup.tail("inference-0", lines=3) == "started\nCUDA out of memory\n"
