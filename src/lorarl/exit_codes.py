"""The exit codes of every lorarl command, one place for all of them: the launcher reads its children's
codes by these names (a restart would end the same way after BAD_INPUT, TRAINING_STOPPED or
DISK_FULL, so `auto_resume` does not restart them, and `rl` shows their one line alone), and a
script calling `rl` or `sft` can tell the ends apart.

A signal ends a command with 128 + its number (130 for Ctrl-C), as a shell reports it.
"""

OK = 0
FAILED = 1  # anything else that went wrong: a crash, a process that died, a timeout
BAD_INPUT = 2  # refused before anything started or changed: the config, the data, the run folder, a server
TRAINING_STOPPED = 3  # training went wrong beyond repair (NaN weights, a gradient stuck at 0): nothing written
DISK_FULL = 4  # a write found no space left: its partial write removed, the folder and its free space said
ENDS_THAT_REPEAT = (BAD_INPUT, TRAINING_STOPPED, DISK_FULL)


def for_signal(signum: int) -> int:
    """The exit code of a command that a signal ended."""
    return 128 + signum
