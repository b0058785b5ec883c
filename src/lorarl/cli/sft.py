"""`sft @ cfg.toml`: supervised fine-tuning (LoRA from [model.lora], or full without it).

The run folder is checked and prepared (see RunFolder.prepare) before anything else; `--dry-run`
makes the same checks and prints the memory plan (docs/memory_plan.md). With
`--parallel.dp N` it starts itself again under torchrun as N data-parallel ranks.
"""

from __future__ import annotations

import logging
import os
import sys

from lorarl.cli.common import ctrl_c_in_one_line, exit_with, load_run_or_exit, setup_logging
from lorarl.config.run import RunMode
from lorarl.config.sft import SFTConfig
from lorarl.exit_codes import BAD_INPUT, DISK_FULL, TRAINING_STOPPED
from lorarl.launcher.memory_plan import sft_memory_plan
from lorarl.launcher.plan import torchrun
from lorarl.launcher.preflight import PreflightError, check_sft
from lorarl.run_folder import DiskFull, RunFolder, RunFolderError

log = logging.getLogger("lorarl.sft")
# Set for the torchrun ranks of an `sft` that has prepared the run folder already.
_PREPARED = "LORARL_SFT_RUN_PREPARED"


@ctrl_c_in_one_line("sft")
def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    cfg, mode = load_run_or_exit(SFTConfig, RunMode, args)
    setup_logging("sft")
    if mode.dry_run:
        prepare(cfg, mode)
        print(sft_memory_plan(cfg, mode).table(), end="")
        print(f"# dry run: {cfg.run_dir} checked, nothing cleared or started")
        return
    if os.environ.get(_PREPARED) != str(cfg.run_dir):
        prepare(cfg, mode)  # takes the run's lock, held until this process (or what it execs into) ends
    if cfg.parallel.dp > 1 and "WORLD_SIZE" not in os.environ:
        os.environ[_PREPARED] = str(cfg.run_dir)
        os.execv(sys.executable, [*torchrun(cfg.parallel.dp), "-m", "lorarl.cli.sft", *args])
    from lorarl.trainer.sft import train  # torch and transformers load only once the config is valid
    from lorarl.trainer.sft_data import DataError
    from lorarl.trainer.update_watch import TrainingStopped

    try:
        train(cfg)
    except DataError as e:
        exit_with(e, BAD_INPUT)
    except TrainingStopped as e:  # the run went wrong (NaN weights, no gradient): no result written
        exit_with(e, TRAINING_STOPPED)
    except DiskFull as e:  # one line naming the folder and its free space
        exit_with(e, DISK_FULL)


def prepare(cfg: SFTConfig, mode: RunMode) -> None:
    """Every check, then the run folder (RunFolder.prepare) and, unless a dry run, its lock; one line and
    exit 2 if not."""
    run = RunFolder(cfg.run_dir)
    try:
        check_sft(cfg, mode)
        resume = cfg.resume
        # Looked for once the folder passed its own checks (a planted link is named so); said by the
        # trainer (in this process) as it resumes, or here by a dry run, which has none.
        checkpoint = None if resume is None else lambda: run.resume_step(resume.step, quiet=not mode.dry_run)
        done = run.prepare(
            "sft", cfg.model_dump(mode="json"), resume is not None, mode.overwrite, mode.dry_run, checkpoint
        )
        log.info(done)
        if not mode.dry_run:
            run.hold_lock()
    except (PreflightError, RunFolderError, ValueError) as e:  # DataError is a ValueError
        exit_with(e, BAD_INPUT)


if __name__ == "__main__":
    main()
