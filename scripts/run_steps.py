"""What the learning check and the seed experiments share: running lorarl's commands from the
repository root, as a user would, each with its output in a log file, and the tiny models they train.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the installed console scripts: rl, sft, lorarl-plot
TINY_MODEL = "outputs/models/tiny-qwen3"
# The local models recipes start from, with their `python -m lorarl.tiny_model` sizes: the 0.8M
# quickstart model, and a 3.2M one (4x wider layers' weights) for tasks that need to copy from the
# prompt (names, numbers), which the small one learns too slowly.
LOCAL_MODELS = {TINY_MODEL: [], "outputs/models/qwen3-3m": ["--hidden-size", "256"]}


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


def ensure_local_model(logs: Path, model: str = TINY_MODEL) -> None:
    """Build `model` if it is one of LOCAL_MODELS and not there yet; any other model (a recipe
    pointed at one of the user's) is theirs, and `sft` says if it is missing."""
    if model in LOCAL_MODELS and not (REPO / model / "config.json").exists():
        cmd = [sys.executable, "-m", "lorarl.tiny_model", model, *LOCAL_MODELS[model]]
        run_logged(cmd, logs / f"{Path(model).name}.log")
