"""`lorarl-orchestrator @ cfg.toml`: the rollout loop alone (reads [model], [orchestrator], [inference]).

Run alone, it writes only into a run folder that lorarl prepared (see `lorarl-trainer`); `--dry-run`
makes that check and starts nothing.
"""

from __future__ import annotations

import asyncio
import sys

from lorarl.cli.common import setup_logging, stop_at_once_on_ctrl_c
from lorarl.cli.trainer import role_config_or_exit
from lorarl.exit_codes import BAD_INPUT, DISK_FULL
from lorarl.run_folder import DiskFull


def main(argv: list[str] | None = None) -> None:
    cfg = role_config_or_exit(argv, "orchestrator")
    setup_logging("orchestrator")
    stop_at_once_on_ctrl_c("orchestrator")
    from lorarl.orchestrator.adapters import AdapterNameInUse
    from lorarl.orchestrator.orchestrator import orchestrate
    from lorarl.orchestrator.served_check import ServedCheckFailed

    try:
        asyncio.run(orchestrate(cfg))
    except* AdapterNameInUse as refused:  # from a task of the loop; `rl` shows this line, exit code 2
        print(f"error: {refused.exceptions[0]}", file=sys.stderr)
        raise SystemExit(BAD_INPUT) from None
    except* ServedCheckFailed as failed:  # a worker serves another policy: `rl` shows this line, exit code 2
        print(f"error: {failed.exceptions[0]}", file=sys.stderr)
        raise SystemExit(BAD_INPUT) from None
    except* DiskFull as full:  # a batch found no space: the folder and its free space, in `rl`'s one line
        print(f"error: {full.exceptions[0]}", file=sys.stderr)
        raise SystemExit(DISK_FULL) from None


if __name__ == "__main__":
    main()
