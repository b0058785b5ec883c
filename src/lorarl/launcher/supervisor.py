"""`Supervisor`: runs the processes of a run, each in its own process group with its own log,
and stops all of them (and everything they started) together."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import deque
from functools import partial
from pathlib import Path

from lorarl.launcher.plan import ProcessSpec
from lorarl.written import record_written


class Supervisor:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, spec: ProcessSpec) -> subprocess.Popen[bytes]:
        """Start `spec`; a process started again (a restart) appends to its log."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(spec.name), "ab" if spec.name in self.procs else "wb") as log:
            record_written(self.log_path(spec.name))
            # A new session per child: a terminal's Ctrl-C reaches only `rl`, which then stops each
            # child's whole group (vLLM's engine core and workers included).
            proc = subprocess.Popen(
                spec.cmd, env={**os.environ, **spec.env}, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=partial(_terminate_with_parent, os.getpid()) if sys.platform == "linux" else None,
            )  # fmt: skip
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

    def stop(self, names: list[str], grace: float = 15.0) -> None:
        procs = [self.procs[n] for n in names]
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in procs:
            # Also catches grandchildren left behind by a leader that has already exited.
            _signal_group(proc, signal.SIGKILL)
            proc.wait()

    def tail(self, name: str, lines: int = 40) -> str:
        try:
            with open(self.log_path(name), errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except FileNotFoundError:
            return ""


def _terminate_with_parent(parent: int) -> None:
    """In the child, before exec: SIGTERM when `rl` dies, even by SIGKILL, which gives it no chance
    to stop its children (each then stops its own: vLLM its engine, torchrun its ranks)."""
    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # rl died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
