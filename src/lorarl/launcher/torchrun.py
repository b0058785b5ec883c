"""torchrun as lorarl starts data-parallel ranks on one machine (`sft` and `rl` at parallel.dp > 1,
plan.torchrun): it ends as its first failed rank ended, so that the exit codes the launcher reads
(supervisor.ENDS_THAT_REPEAT: 2, input refused; 3, training stopped) survive it, and without
torchrun's own report of the failure, a traceback and a table that would bury the rank's one line.

    python -m lorarl.launcher.torchrun <torchrun's arguments>
"""

from __future__ import annotations

import logging
import signal
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main

from lorarl import exit_codes


def main(argv: list[str] | None = None) -> None:
    # Its log lines too: the agent's ("Sending process ... closing signal", "failed (exitcode: 3)") and
    # its banner that each rank gets OMP_NUM_THREADS=1 (a notice; it still sets it).
    for name in ("torch.distributed.elastic", "torch.distributed.run"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        torchrun_main(sys.argv[1:] if argv is None else argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = failure.exitcode
        if code not in exit_codes.ENDS_THAT_REPEAT:  # those ranks said why in one line; a crash left its traceback
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            print(f"error: rank {rank} of {e.name} {how}; the other ranks were stopped", file=sys.stderr)
        raise SystemExit(code if code > 0 else exit_codes.for_signal(-code)) from None


if __name__ == "__main__":
    main()
