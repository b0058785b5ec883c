"""`Supervisor`: runs the processes of a run, each in its own process group with its own log,
and stops all of them (and everything they started) together.

A process group outlives its leader: a vLLM server killed with SIGKILL leaves its engine core, its
workers and multiprocessing's resource tracker running (gigabytes, a GPU's memory) in the dead
server's group. So a process is stopped by its group, recorded at start (its pid: each child leads a
session of its own), and a process started again under the same name (a restart) first has what is
left of its previous group stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from functools import partial
from pathlib import Path

import psutil

from lorarl.launcher.plan import ProcessSpec
from lorarl.written_files import record_written

log = logging.getLogger("lorarl.rl")
_VLLM_ROUTE = "] Route: /"  # vLLM's start: "(APIServer pid=N) INFO ... [launcher.py:195] Route: /docs, Methods: GET"
KILL_WAIT = 5.0  # seconds for SIGKILLed processes to be gone (their memory freed) before a restart


class Supervisor:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, spec: ProcessSpec) -> subprocess.Popen[bytes]:
        """Start `spec`; a process started again (a restart) appends to its log, once every process
        left in its previous group is stopped (their port and memory are the new one's)."""
        if spec.name in self.procs and (left := self.stop([spec.name])):
            log.warning("%s: stopped %d process(es) its previous run left in its process group", spec.name, left)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(spec.name), "ab" if spec.name in self.procs else "wb") as out:
            record_written(self.log_path(spec.name))
            # A new session per child: a terminal's Ctrl-C reaches only `rl`, which then stops each
            # child's whole group (vLLM's engine core and workers included).
            proc = subprocess.Popen(
                spec.cmd,
                env={**os.environ, **spec.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=partial(_terminate_with_parent, os.getpid()) if sys.platform == "linux" else None,
            )
        self.procs[spec.name] = proc
        return proc

    def failed(self) -> tuple[str, int] | None:
        """The first child that exited with an error, as (name, exit code)."""
        for name, proc in self.procs.items():
            if proc.poll() not in (None, 0):
                return name, proc.returncode
        return None

    def finished(self, names: list[str]) -> bool:
        return all(self.procs[n].poll() == 0 for n in names)

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM every group, SIGKILL what is left after `grace` seconds."""
        self.stop(list(self.procs), grace)

    def stop(self, names: list[str], grace: float = 15.0) -> int:
        """SIGTERM the groups of `names`, SIGKILL what is left after `grace` seconds; returns how many
        processes were left in those groups besides a leader that had already exited."""
        procs = [self.procs[n] for n in names]
        left = sum(len(group_members(p.pid)) for p in procs if p.poll() is not None)
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        # Members outlive a leader (vLLM's engine core and workers): they get the grace period too.
        wait_groups([p.pid for p in procs], deadline)
        for proc in procs:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        wait_groups([p.pid for p in procs], time.monotonic() + KILL_WAIT)
        return left

    def tail(self, name: str, lines: int = 40) -> str:
        """The last `lines` lines of `name`'s log, less vLLM's listing of its routes (39 lines at its
        start), which would otherwise fill the tail of a worker that failed soon after starting."""
        try:
            with open(self.log_path(name), errors="replace") as f:
                return "".join(deque((line for line in f if _VLLM_ROUTE not in line), maxlen=lines))
        except FileNotFoundError:
            return ""


def _terminate_with_parent(parent: int) -> None:
    """In the child, before exec: SIGTERM when `rl` dies, even by SIGKILL, which gives it no chance
    to stop its children (each then stops its own: vLLM its engine, torchrun its ranks)."""
    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # rl died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def group_members(pgid: int) -> list[psutil.Process]:
    """The live processes of process group `pgid` (zombies, already dead, left out)."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
    return members


def wait_groups(pgids: list[int], deadline: float) -> None:
    """Until no process of `pgids` is alive, or `deadline` (time.monotonic()) has passed."""
    while any(group_members(g) for g in pgids) and time.monotonic() < deadline:
        time.sleep(0.1)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
