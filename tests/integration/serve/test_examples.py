"""The shipped SDK loops (`examples/tinker_client/`) run as docs/serve.md has a user run them: with the
venv's Python, TINKER_BASE_URL and TINKER_API_KEY, against a running `lorarl-serve`. A few steps each:
that they learn is measured in docs/serve.md and asserted of the same kind of loop in test_sdk.py; here,
that the files a user copies still work against this server."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.integration.serve.conftest import KEY, Server

pytestmark = [pytest.mark.integration]

EXAMPLES = REPO / "examples" / "tinker_client"


def run_example(server: Server, script: str, *args: str) -> str:
    env = {**os.environ, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": KEY, "TINKER_TELEMETRY": "0"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_sft_loop_learns_and_the_rl_loop_starts_from_its_saved_state(server: Server) -> None:
    out = run_example(server, "sft_loop.py", "--steps", "6", "--batch", "8", "--rank", "8", "--name", "example-sft")
    losses = [float(x) for x in re.findall(r"^step \d+: loss ([\d.]+) per token$", out, re.M)]
    assert len(losses) == 6 and losses[-1] < losses[0], out
    saved = re.search(r"^saved (tinker://\S+)$", out, re.M)
    assert saved, out

    out = run_example(server, "rl_loop.py", "--from", saved[1], "--steps", "2", "--words", "2", "--group", "4")
    rewards = [float(x) for x in re.findall(r"^step \d+: mean reward ([\d.]+)$", out, re.M)]
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards), out
