"""What the learning check and the seed experiments share: running lorarl's commands from the
repository root, as a user would, each with its output in a log file, and the tiny model they train.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the installed console scripts: rl, sft, lorarl-plot
TINY_MODEL = "outputs/models/tiny-qwen3"


def run_logged(cmd: list[str], log: Path) -> float:
    """Run `cmd` from the repository root with its output in `log`; its wall time in seconds. A
    failure ends the script with the end of the log."""
    print(f"$ {' '.join(cmd)}   (log: {log})", flush=True)
    start = time.monotonic()
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if code:
        sys.exit(f"failed ({code}); the end of {log}:\n" + "\n".join(log.read_text().splitlines()[-20:]))
    return time.monotonic() - start


def ensure_tiny_model(logs: Path) -> None:
    if not (REPO / TINY_MODEL / "config.json").exists():
        run_logged([sys.executable, "-m", "lorarl.tiny_model", TINY_MODEL], logs / "tiny_model.log")
