"""`rl @ cfg.toml`: start vLLM workers, the orchestrator and the trainer; supervise them.

If any of them fails, the others are stopped and `rl` exits non-zero with the tail of the failing
log. Ctrl-C or SIGTERM stops everything and leaves no process behind.
"""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import time
from types import FrameType

from lorarl.cli.common import load_or_exit, setup_logging
from lorarl.config.models import RLConfig
from lorarl.inference.server import is_healthy, worker_urls
from lorarl.launcher.plan import ProcessSpec, plan_run
from lorarl.launcher.supervisor import Supervisor
from lorarl.monitor.console import StepPrinter
from lorarl.orchestrator.envs import load_environment
from lorarl.run_folder import RunFolder

log = logging.getLogger("lorarl.rl")


class Stop(Exception):
    """A SIGINT or SIGTERM arrived."""


def main(argv: list[str] | None = None) -> None:
    cfg = load_or_exit(RLConfig, argv)
    setup_logging("rl")
    run = RunFolder(cfg.run_dir)
    # Mistakes that would otherwise surface only after vLLM has started.
    for env in cfg.orchestrator.env:
        try:
            load_environment(env.id, env.args)
        except (ValueError, TypeError, ImportError, AttributeError) as e:
            print(f"error: [[orchestrator.env]] {env.id!r} with args {env.args}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    try:
        if not cfg.dry_run:
            cfg.lora.check_for_rl()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if not cfg.dry_run:
        clear_previous_outputs(run, resume=cfg.resume is not None)
    specs = plan_run(cfg, run, has_gpu=_has_gpu())
    if cfg.dry_run:
        print((run.configs / "commands.txt").read_text(), end="")
        print(f"# resolved configs in {run.configs}/ (dry run: nothing started)")
        return

    def _stop(signum: int, _frame: FrameType | None) -> None:
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    supervisor = Supervisor(run.logs)
    code = 1
    try:
        code = supervise(cfg, run, specs, supervisor)
    except Stop as e:
        log.info("%s: stopping every process of the run", e)
        code = 130
    finally:
        # Ignore further signals while stopping, so a second Ctrl-C cannot leave orphans.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop_all()
    raise SystemExit(code)


def supervise(cfg: RLConfig, run: RunFolder, specs: list[ProcessSpec], supervisor: Supervisor) -> int:
    workers = [s for s in specs if s.name.startswith("inference-")]
    for spec in workers:
        supervisor.start(spec)
        log.info("started %s (log: %s)", spec.name, supervisor.log_path(spec.name))
    urls = worker_urls(cfg)
    if workers:
        log.info("waiting for vLLM at %s", ", ".join(urls))
    deadline = time.monotonic() + cfg.inference.startup_timeout
    pending = list(urls)
    while pending:
        if failed := supervisor.failed():
            return report_failure(supervisor, *failed)
        if time.monotonic() > deadline:
            log.error("inference did not become healthy within %.0f s: %s", cfg.inference.startup_timeout, pending)
            return 1
        pending = [u for u in pending if not is_healthy(u)]
        time.sleep(0.5)
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


def clear_previous_outputs(run: RunFolder, resume: bool) -> None:
    """A new run in an old folder starts clean: stale adapters or batches would be picked up. A
    resumed run keeps checkpoints and metrics (the trainer drops rows after its checkpoint) and
    regenerates batches and adapters from the checkpoint on."""
    stale = [run.root / d for d in ("rollouts", "broadcasts", "samples", "logs")]
    if not resume:
        stale += [run.metrics, run.root / "checkpoints"]
    if any(p.exists() for p in stale):
        log.info("clearing the previous run's %s in %s", ", ".join(p.name for p in stale if p.exists()), run.root)
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
