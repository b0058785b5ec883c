"""torchrun as lorarl starts ranks (launcher/torchrun.py) ends with its first failed rank's exit code
and no report of its own but one line for a crash: real torchrun, two CPU ranks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lorarl.exit_codes import TRAINING_STOPPED
from lorarl.launcher.plan import torchrun

# Every rank says why in one line (rank 0 alone, as cli/common.exit_with) and exits 3, or rank 1 is
# killed by SIGKILL (as the kernel's OOM killer does) while rank 0 waits.
RANKS = """
import os, signal, sys, time
rank = os.environ["RANK"]
if sys.argv[1] == "stop":
    if rank == "0":
        print("error: step 2: training stopped", file=sys.stderr)
    sys.exit(3)
if rank == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def ranks(tmp_path: Path, how: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    return subprocess.run([*torchrun(2), str(script), how], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_ranks_that_stop_leave_their_one_line_and_exit_code(tmp_path: Path) -> None:
    result = ranks(tmp_path, "stop")
    assert result.returncode == TRAINING_STOPPED, result.stderr
    assert [line for line in result.stderr.splitlines() if line.strip()] == ["error: step 2: training stopped"]


@pytest.mark.slow
def test_a_killed_rank_is_said_in_one_line_and_its_signal_is_the_exit_code(tmp_path: Path) -> None:
    result = ranks(tmp_path, "kill")
    assert result.returncode == 128 + 9, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: rank 1 of ")
    assert "was killed by SIGKILL; the other ranks were stopped" in result.stderr
    assert "Traceback" not in result.stderr
