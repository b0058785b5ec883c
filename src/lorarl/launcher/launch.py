"""Run the processes of an `rl` run and supervise them until they finish, fail for good, or a
signal arrives.

Inference workers start first; the orchestrator and trainer start once every worker is healthy.
A worker that dies is restarted (`inference.max_restarts`); the orchestrator routes around it
meanwhile. A trainer or orchestrator that dies restarts both from the latest complete checkpoint
(`auto_resume`), keeping the workers, unless its exit code says a restart would end the same way
(exit_codes.ENDS_THAT_REPEAT). Any other failure stops every process, and the run ends
non-zero with the tail of the failing log. Ctrl-C or SIGTERM stops everything and leaves no
process behind; `rl` then exits with 128 + the signal's number (130, 143), as a shell reports a
process killed by it. On a Ray cluster (cluster.backend = "ray") the same loop drives `RayCluster`,
which places the workers and trainer ranks on the cluster's nodes and has the `Supervisor`'s
interface.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections import Counter
from types import FrameType

from lorarl import exit_codes
from lorarl.config.run import ResumeConfig, RLConfig
from lorarl.inference.health import wait_until_healthy
from lorarl.inference.server import worker_urls
from lorarl.launcher.placement import Placement
from lorarl.launcher.plan import ProcessSpec, plan_run
from lorarl.launcher.ray_cluster import ClusterError, RayCluster  # imports Ray only once a run uses it
from lorarl.launcher.stall_watch import StallWatch
from lorarl.launcher.supervisor import Supervisor
from lorarl.monitor.console import StepPrinter
from lorarl.run_folder import RunFolder, RunFolderError

log = logging.getLogger("lorarl.rl")


class Stop(Exception):
    """A SIGINT or SIGTERM arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise Stop(signum)


def launch(cfg: RLConfig, auto_resume: int, run: RunFolder, specs: list[ProcessSpec], placement: Placement) -> int:
    """Start `specs` (in order), supervise them, stop them all; returns the exit code for `rl`. `auto_resume`:
    how often a dead trainer or orchestrator is resumed from the latest checkpoint (RLRunMode)."""
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    supervisor: Supervisor | RayCluster[RLConfig] = Supervisor(run.logs)
    try:
        if placement.ray:
            supervisor = RayCluster(cfg, run)
            log.info("placing the run on Ray (%s)", cfg.cluster.address or "a Ray instance of its own")
            placement = supervisor.open()
            cfg = supervisor.cfg  # with each worker's own run folder, if they have their own (cluster.shared_fs)
            specs = plan_run(cfg, run, placement)  # the workers' addresses are known now
        log.info("placement (%s):\n%s", run.configs / "placement.txt", placement.table().rstrip())
        return supervise(cfg, auto_resume, run, specs, supervisor, placement)
    except Stop as e:
        log.info("%s: stopping every process of the run", e)
        return exit_codes.for_signal(e.signum)
    except ClusterError as e:
        log.error("%s", e)
        return exit_codes.FAILED
    finally:
        # Ignore further signals while stopping, so a second Ctrl-C cannot leave orphans.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop_all()


def supervise(
    cfg: RLConfig,
    auto_resume: int,
    run: RunFolder,
    specs: list[ProcessSpec],
    supervisor: Supervisor | RayCluster,
    placement: Placement,
) -> int:
    workers = [s for s in specs if s.role == "inference"]
    roles = [s for s in specs if s not in workers]
    for spec in workers:
        start(supervisor, spec)
    urls = worker_urls(cfg, placement.worker_hosts())
    if workers:
        log.info("waiting for vLLM at %s", ", ".join(urls))
    try:
        wait_until_healthy(urls, cfg.inference.startup_timeout, alive=lambda: supervisor.failed() is None)
    except RuntimeError:
        return report_failure(supervisor, *supervisor.failed() or ("inference", exit_codes.FAILED))
    except TimeoutError as e:
        log.error("%s (inference.startup_timeout)", e)
        return exit_codes.FAILED
    log.info("inference ready; starting orchestrator and trainer")
    for spec in roles:
        start(supervisor, spec)

    printer = StepPrinter(run.metrics, cfg.max_steps)
    watch = StallWatch(
        cfg.monitor.stall_warning,
        cfg.monitor.stall_stop,
        lambda role: (supervisor.log_path(role), supervisor.tail(role)),
        policy_written=lambda: any(
            view.latest_stable_broadcast() is not None
            for view in [run.for_variant(v.name) for v in cfg.variants] or [run]
        ),
    )
    restarts: Counter[str] = Counter()
    while True:
        for line in printer.poll():
            if cfg.monitor.console:
                print(line, flush=True)
        watch.steps(printer.latest)
        said, stop = watch.check() if cfg.monitor.jsonl else (None, False)
        if said:
            (log.error if stop else log.warning)("%s", said)
        if stop:
            return exit_codes.FAILED
        if supervisor.finished([s.name for s in roles]):
            log.info("run finished: %s", run.root)
            return exit_codes.OK
        if failed := supervisor.failed():
            name, code = failed
            if name in {s.name for s in workers} and restarts[name] < cfg.inference.max_restarts:
                restarts[name] += 1
                log.warning(
                    "%s exited with code %d; restart %d of %d (inference.max_restarts)",
                    name,
                    code,
                    restarts[name],
                    cfg.inference.max_restarts,
                )
                start(supervisor, next(s for s in workers if s.name == name))
            elif (
                name in {s.name for s in roles}
                and (step := auto_resume_step(cfg, run, code, restarts["roles"], auto_resume)) is not None
            ):
                restarts["roles"] += 1
                log.warning(
                    "%s exited with code %d; resuming from checkpoint step %d, %d of %d (auto_resume)",
                    name,
                    code,
                    step,
                    restarts["roles"],
                    auto_resume,
                )
                roles = resume_roles(cfg, run, step, roles, supervisor, placement)
                watch.restart()
            else:
                return report_failure(supervisor, name, code)
        time.sleep(0.5)


def auto_resume_step(cfg: RLConfig, run: RunFolder, code: int, restarts: int, allowed: int) -> int | None:
    """The checkpoint that a trainer or orchestrator which exited with `code` is restarted from
    (auto_resume; the newest whole one, checksums verified, as they pick it; for a sweep, whole for
    every variant), or None: the `allowed` restarts used up, no such checkpoint, or an exit code that
    says a restart would end the same way."""
    if code in exit_codes.ENDS_THAT_REPEAT or restarts >= allowed:
        return None
    try:
        return run.resume_step(None, [v.name for v in cfg.variants])
    except RunFolderError:
        return None


def resume_roles(
    cfg: RLConfig,
    run: RunFolder,
    step: int,
    roles: list[ProcessSpec],
    supervisor: Supervisor | RayCluster,
    placement: Placement,
) -> list[ProcessSpec]:
    """Stop the trainer and orchestrator, then start both again from the checkpoint of `step` (the latest
    as the role stopped; a newer one the other role wrote since is discarded, as the log said `step`)."""
    supervisor.stop([s.name for s in roles])
    run.clear_regenerated()
    run.remove_interrupted_checkpoint_writes()  # the dead role's cut-short write, if any
    run.discard_after(step, [v.name for v in cfg.variants])
    resumed = cfg.model_copy(update={"resume": ResumeConfig(step=step)})
    new_roles = [s for s in plan_run(resumed, run, placement) if s.role != "inference"]
    for spec in new_roles:
        start(supervisor, spec)
    return new_roles


def start(supervisor: Supervisor | RayCluster, spec: ProcessSpec) -> None:
    supervisor.start(spec)
    log.info("started %s (log: %s)", spec.name, supervisor.log_path(spec.name))


def report_failure(supervisor: Supervisor | RayCluster, name: str, code: int) -> int:
    """Log why the run stops; its exit code. A trainer or orchestrator whose end a restart would repeat
    (ENDS_THAT_REPEAT) is the last line of its log, its reason, and `rl` exits with its code: 2 for a
    refusal, as for any bad input; 3 for training stopped."""
    tail = supervisor.tail(name)
    if code in exit_codes.ENDS_THAT_REPEAT and name in {"orchestrator", "trainer"} and tail.strip():
        log.error("%s: %s", name, tail.strip().splitlines()[-1].removeprefix("error: "))
        return code
    path = supervisor.log_path(name)
    if not tail.strip():  # the cause in the one line: there are no last lines to show it
        gone = "is gone (was the run folder deleted?)" if not path.exists() else "is empty"
        log.error("%s %s; stopping the run. Its log %s %s", name, ended(code), path, gone)
    else:
        log.error("%s %s; stopping the run. Last lines of %s:\n%s", name, ended(code), path, tail)
    return exit_codes.FAILED


def ended(code: int) -> str:
    """How a process with return code `code` ended, in words: a negative one is the signal that killed it."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"
