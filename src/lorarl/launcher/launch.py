"""Run the processes of an `rl` run and supervise them until they finish, one fails, or a signal
arrives.

Inference workers start first; the orchestrator and trainer start once every worker is healthy.
If any process fails, the others are stopped and the run ends non-zero with the tail of the
failing log. Ctrl-C or SIGTERM stops everything and leaves no process behind.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

from lorarl.config.models import RLConfig
from lorarl.inference.health import wait_until_healthy
from lorarl.inference.server import worker_urls
from lorarl.launcher.plan import ProcessSpec
from lorarl.launcher.supervisor import Supervisor
from lorarl.monitor.console import StepPrinter
from lorarl.run_folder import RunFolder

log = logging.getLogger("lorarl.rl")


class Stop(Exception):
    """A SIGINT or SIGTERM arrived."""


def launch(cfg: RLConfig, run: RunFolder, specs: list[ProcessSpec]) -> int:
    """Start `specs` (in order), supervise them, stop them all; returns the exit code for `rl`."""

    def _stop(signum: int, _frame: FrameType | None) -> None:
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    supervisor = Supervisor(run.logs)
    try:
        return supervise(cfg, run, specs, supervisor)
    except Stop as e:
        log.info("%s: stopping every process of the run", e)
        return 130
    finally:
        # Ignore further signals while stopping, so a second Ctrl-C cannot leave orphans.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop_all()


def supervise(cfg: RLConfig, run: RunFolder, specs: list[ProcessSpec], supervisor: Supervisor) -> int:
    workers = [s for s in specs if s.name.startswith("inference-")]
    for spec in workers:
        supervisor.start(spec)
        log.info("started %s (log: %s)", spec.name, supervisor.log_path(spec.name))
    urls = worker_urls(cfg)
    if workers:
        log.info("waiting for vLLM at %s", ", ".join(urls))
    try:
        wait_until_healthy(urls, cfg.inference.startup_timeout, alive=lambda: supervisor.failed() is None)
    except RuntimeError:
        return report_failure(supervisor, *supervisor.failed() or ("inference", 1))
    except TimeoutError as e:
        log.error("%s (inference.startup_timeout)", e)
        return 1
    log.info("inference ready; starting orchestrator and trainer")

    roles = [s for s in specs if s not in workers]
    for spec in roles:
        supervisor.start(spec)
        log.info("started %s (log: %s)", spec.name, supervisor.log_path(spec.name))
    printer = StepPrinter(run.metrics, cfg.max_steps)

    def print_steps() -> None:
        if cfg.monitor.console:
            for line in printer.poll():
                print(line, flush=True)

    while True:
        print_steps()
        if failed := supervisor.failed():
            return report_failure(supervisor, *failed)
        if supervisor.finished([s.name for s in roles]):
            print_steps()
            log.info("run finished: %s", run.root)
            return 0
        time.sleep(0.5)


def report_failure(supervisor: Supervisor, name: str, code: int) -> int:
    log.error("%s exited with code %d; stopping the run. Last lines of %s:\n%s", name, code,
              supervisor.log_path(name), supervisor.tail(name))  # fmt: skip
    return 1
