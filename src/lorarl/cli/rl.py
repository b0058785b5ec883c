"""`rl @ cfg.toml`: check the config, prepare the run folder, start and supervise the run.

Nothing is cleared or started until every check has passed (`--dry-run` makes the same checks).
"""

from __future__ import annotations

import logging

from lorarl.cli.common import ctrl_c_in_one_line, exit_with, load_run_or_exit, setup_logging
from lorarl.config.run import RLConfig, RLRunMode
from lorarl.exit_codes import BAD_INPUT
from lorarl.launcher.launch import launch
from lorarl.launcher.memory_plan import rl_memory_plan
from lorarl.launcher.plan import plan_run
from lorarl.launcher.preflight import PreflightError, check_rl
from lorarl.run_folder import RunFolder, RunFolderError
from lorarl.written_files import record_written

log = logging.getLogger("lorarl.rl")


@ctrl_c_in_one_line("rl")
def main(argv: list[str] | None = None) -> None:
    cfg, mode = load_run_or_exit(RLConfig, RLRunMode, argv)
    setup_logging("rl")
    run = RunFolder(cfg.run_dir)
    try:
        placement = check_rl(cfg, mode)
        resume, variants = cfg.resume, [v.name for v in cfg.variants]
        # Looked for once the folder passed its own checks: a planted link or a renamed variant is named so.
        checkpoint = None if resume is None else lambda: run.resume_step(resume.step, variants)
        config = cfg.model_dump(mode="json")
        done = run.prepare("rl", config, resume is not None, mode.overwrite, mode.dry_run, checkpoint, variants)
    except (PreflightError, RunFolderError) as e:
        exit_with(e, BAD_INPUT)
    log.info(done)
    if not mode.dry_run:
        run.hold_lock()
    specs = plan_run(cfg, run, placement)
    # Checked by check_rl; the model's shape is cached.
    memory = rl_memory_plan(cfg, placement, mode.device_memory_gib).table()
    (run.configs / "memory_plan.txt").write_text(memory)
    record_written(run.configs / "memory_plan.txt")
    if mode.dry_run:
        print(placement.table())
        print(memory)
        print((run.configs / "commands.txt").read_text(), end="")
        print(f"# resolved configs, placement.txt and memory_plan.txt in {run.configs}/ (dry run: nothing started)")
        return
    if cfg.model.quantization != "none" and not cfg.inference.urls:
        from lorarl.quantized_base import ensure_served_base  # torch, bitsandbytes: only for a quantized base

        log.info("vLLM serves %s", ensure_served_base(cfg.model, run.root))
    raise SystemExit(launch(cfg, mode.auto_resume, run, specs, placement))


if __name__ == "__main__":
    main()
