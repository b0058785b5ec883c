"""`rl @ cfg.toml`: check the config, prepare the run folder, start and supervise the run.

Nothing is cleared or started until every check has passed (`--dry-run` makes the same checks).
"""

from __future__ import annotations

import logging

from lorarl.cli.common import exit_with, load_or_exit, setup_logging
from lorarl.config.models import RLConfig
from lorarl.launcher.launch import launch
from lorarl.launcher.memory_plan import rl_memory_plan
from lorarl.launcher.placement import visible_gpus
from lorarl.launcher.plan import plan_run
from lorarl.launcher.preflight import PreflightError, check_rl
from lorarl.run_folder import RunFolder, RunFolderError
from lorarl.written import record_written

log = logging.getLogger("lorarl.rl")


def main(argv: list[str] | None = None) -> None:
    cfg = load_or_exit(RLConfig, argv)
    setup_logging("rl")
    run = RunFolder(cfg.run_dir)
    try:
        placement = check_rl(cfg, visible_gpus(cfg))
        if cfg.resume is not None:
            run.resume_step(cfg.resume.step, [v.name for v in cfg.variants])
        done = run.prepare("rl", cfg.model_dump(mode="json"), cfg.resume is not None, cfg.overwrite, cfg.dry_run)
    except (PreflightError, RunFolderError) as e:
        exit_with(e, 2)
    log.info(done)
    if not cfg.dry_run:
        run.hold_lock()
    specs = plan_run(cfg, run, placement)
    memory = rl_memory_plan(cfg, placement).table()  # checked by check_rl; the model's shape is cached
    (run.configs / "memory_plan.txt").write_text(memory)
    record_written(run.configs / "memory_plan.txt")
    if cfg.dry_run:
        print(placement.table())
        print(memory)
        print((run.configs / "commands.txt").read_text(), end="")
        print(f"# resolved configs, placement.txt and memory_plan.txt in {run.configs}/ (dry run: nothing started)")
        return
    raise SystemExit(launch(cfg, run, specs, placement))


if __name__ == "__main__":
    main()
