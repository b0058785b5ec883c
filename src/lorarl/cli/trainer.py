"""`lorarl-trainer @ cfg.toml`: the RL trainer alone (reads [model], [trainer] and the top-level keys).

Run alone, it writes only into a run folder that lorarl prepared (its run.json: `rl`, or `rl --dry-run`,
makes it), so that it never writes among a user's files. `--dry-run` makes that check and starts nothing.
"""

from __future__ import annotations

from lorarl.cli.common import exit_with, load_run_or_exit, setup_logging, stop_at_once_on_ctrl_c
from lorarl.config.run import RLConfig, RunMode
from lorarl.exit_codes import BAD_INPUT, DISK_FULL, TRAINING_STOPPED
from lorarl.run_folder import DiskFull, RunFolder, RunFolderError


def main(argv: list[str] | None = None) -> None:
    cfg = role_config_or_exit(argv, "trainer")
    setup_logging("trainer")
    stop_at_once_on_ctrl_c("trainer")
    from lorarl.trainer.rl import train
    from lorarl.trainer.update_watch import TrainingStopped

    try:
        train(cfg)
    except TrainingStopped as e:  # one line, the last of the trainer's log that `rl` shows
        exit_with(e, TRAINING_STOPPED)
    except DiskFull as e:  # one line naming the folder and its free space, the last of the log
        exit_with(e, DISK_FULL)


def role_config_or_exit(argv: list[str] | None, command: str) -> RLConfig:
    """The config of `command` (a role run alone) once its run folder is found prepared; with --dry-run,
    exit 0 there, having started nothing."""
    cfg, mode = load_run_or_exit(RLConfig, RunMode, argv)
    prepared_or_exit(cfg, command)
    if mode.dry_run:
        print(f"# dry run: {cfg.run_dir} checked, {command} not started")
        raise SystemExit(0)
    return cfg


def prepared_or_exit(cfg: RLConfig, command: str) -> None:
    """Exit 2 with one line unless `cfg`'s run folder bears lorarl's marker."""
    try:
        RunFolder(cfg.run_dir).check_prepared(command)
    except RunFolderError as e:
        exit_with(e, BAD_INPUT)


if __name__ == "__main__":
    main()
