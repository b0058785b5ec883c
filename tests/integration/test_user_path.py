"""The newcomer's path runs as written (issue 45): the commands of README.md, docs/getting_started.md and
docs/your_task.md, taken from their ```bash blocks, run in reading order in a fresh copy of the working
tree, as a user who follows the pages types them. The first is the quickstart, so the rest run after it.

A block whose first line is `# <file>.py` or `# <file>.toml` is a file the page tells the reader to
write: it is written into the copy before the commands that follow it. A command the pages repeat runs
once. Not run: the test suite and its fast lane (scripts/test.sh: the suite around this test runs each
of their tests) and the commands marked `# on the GPU machine`; their configs are still checked, by the
`--dry-run` before them.

The copy gets the shared .venv, not one of its own: setting up takes minutes and a package index.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = ["README.md", "docs/getting_started.md", "docs/your_task.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FILE_HEADER = re.compile(r"# ([\w.-]+\.(?:py|toml))\n")
NOT_RUN = {
    "bash scripts/test.sh": "the whole test suite, this test included",
    "bash scripts/test.sh --fast": "the fast lane: the suite around this test runs each of its tests",
}
GPU_ONLY = "# on the GPU machine"


@dataclass(frozen=True)
class Step:
    page: str
    command: str = ""  # a shell command, or
    file: str = ""  # a file to write, with
    text: str = ""


def _commands(block: str) -> list[str]:
    """The commands of a bash block: one per line (backslash continuations joined), comments kept."""
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _without_comment(command: str) -> str:
    return re.sub(r"\s+#.*$", "", command)


def user_path() -> list[Step]:
    """Every file to write and command to run on the pages, in reading order; repeats left out."""
    steps: list[Step] = []
    seen: set[str] = set()
    for page in PAGES:
        for lang, block in FENCE.findall((REPO / page).read_text()):
            if header := FILE_HEADER.match(block):
                steps.append(Step(page, file=header.group(1), text=block))
                continue
            if lang != "bash":
                continue
            for command in _commands(block):
                bare = _without_comment(command)
                if bare in NOT_RUN or GPU_ONLY in command or bare in seen:
                    continue
                seen.add(bare)
                steps.append(Step(page, command=command))
    return steps


def test_the_path_names_its_steps() -> None:
    """What the slow test below runs: the quickstart first, a dry run before each launch, the reader's files."""
    steps = user_path()
    commands = [s.command for s in steps if s.command]
    assert _without_comment(commands[0]) == "bash scripts/quickstart.sh"
    assert any("--dry-run" in c for c in commands[1:])
    assert {s.file for s in steps if s.file} >= {"my_task.py", "my_task.toml"}
    assert all(_without_comment(c) not in NOT_RUN and GPU_ONLY not in c for c in commands)


def fresh_copy(dest: Path) -> Path:
    """The working tree as a fresh clone of it has it (tracked files and untracked ones git does not
    ignore), plus the shared .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if src.is_file() and name != ".venv":  # a tracked file deleted in the tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name, follow_symlinks=False)
    _shared_venv(dest)
    return dest


def _shared_venv(tree: Path) -> None:
    """`.venv` in the copy: a folder of its own whose entries link to the shared environment's, marked
    set up for the copy's pyproject.toml with setup.sh's own stamp (its lines before the `--force`
    check name it), so the quickstart's setup step is a no-op and never installs into the shared one."""
    shared = (REPO / ".venv").resolve()
    venv = tree / ".venv"
    venv.mkdir()
    for entry in shared.iterdir():
        if not entry.name.startswith(".lorarl-setup-"):
            (venv / entry.name).symlink_to(entry)
    setup = (tree / "scripts/setup.sh").read_text()
    names_stamp = setup.split('if [[ "${1:-}" != "--force"')[0]
    assert "STAMP=" in names_stamp, "scripts/setup.sh no longer names its stamp before the --force check"
    subprocess.run(["bash", "-c", names_stamp + 'touch "$STAMP"', "scripts/setup.sh"], cwd=tree, check=True)


def _user_env(tree: Path) -> dict[str, str]:
    """A user's shell: the tree's own sources first (the shared .venv's lorarl is another checkout's),
    and no HF_HUB_OFFLINE, which the tests set and a user does not (the quickstart sets it itself)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["PYTHONPATH"] = str(tree / "src")
    return env


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(3600)
def test_every_command_on_the_path_runs_as_written(tmp_path: Path) -> None:
    tree = fresh_copy(tmp_path / "lorarl")
    env = _user_env(tree)
    for step in user_path():
        if step.file:
            (tree / step.file).write_text(step.text)
            continue
        start = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", step.command], cwd=tree, env=env, capture_output=True, text=True, timeout=1800
        )
        print(f"{time.monotonic() - start:6.1f} s  {step.page}: {step.command}")
        assert done.returncode == 0, (
            f"{step.page}: `{step.command}` exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
        )
