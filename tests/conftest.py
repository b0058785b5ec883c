"""Shared fixtures: the tiny local model, and one real vLLM server reused by integration tests; the
lanes' marks (`vllm` from the fixtures a test asks for; `gpu` deselected where no GPU is)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
# Every vLLM server of the tests requires this key (inference.api_key), so every test also checks
# that lorarl sends it.
API_KEY = "lorarl-test-key"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lorarl.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3")


# Ports handed to vLLM come from below the kernel's ephemeral range (32768..60999 by default) and above
# Ray's worker ports (10002..19999): a port the OS picked with bind(0) can be given again to any
# outgoing connection or Ray process before vLLM binds it (a CI run failed so: "Address already in use").
TEST_PORTS = range(20000, 32768)


def free_port(consecutive: int = 1) -> int:
    """A port p such that p .. p + consecutive - 1 are all free on every address (worker i listens on
    port + i)."""
    pick = random.SystemRandom()  # not the seeded `random` of a test
    while True:
        port = pick.randrange(TEST_PORTS.start, TEST_PORTS.stop - consecutive)
        try:
            for p in range(port, port + consecutive):
                with socket.socket() as s:
                    s.bind(("", p))
            return port
        except OSError:
            continue


@contextlib.contextmanager
def serve_vllm(
    tiny_model: Path, log: Path, *vllm_args: str, by_hand: tuple[str, ...] = ()
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A vLLM server of `tiny_model` (its url and process, the leader of its own process group),
    started with lorarl's own `lorarl-inference` entry point, so it runs exactly the command `rl` would;
    its output goes to `log`. Room for adapters of several runs (max_async_level 2). `vllm_args`:
    more flags for vLLM (inference.extra_args). `by_hand`: flags that lorarl refuses there (its own,
    such as --served-model-name): the server is then the command `lorarl-inference --dry-run` prints,
    with them added, as a user who starts vLLM by hand for `inference.urls` might."""
    port = free_port()
    cmd = [sys.executable, "-m", "lorarl.cli.inference", "--model.name", str(tiny_model),
           "--seq_len", "2048", "--inference.port", str(port), "--orchestrator.max_async_level", "2",
           "--inference.api_key", API_KEY,
           *(["--inference.extra_args", json.dumps(vllm_args)] if vllm_args else [])]  # fmt: skip
    if by_hand:
        printed = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, check=True).stdout.strip()
        cmd = ["bash", "-c", f"{printed} {shlex.join(by_hand)}"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    from lorarl.inference.health import wait_until_healthy

    try:
        try:
            wait_until_healthy([url], timeout=300, alive=lambda: proc.poll() is None)
        except RuntimeError as e:
            raise RuntimeError(f"{e}:\n{log.read_text()[-3000:]}") from None
        yield url, proc
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM server for the session (`serve_vllm`)."""
    with serve_vllm(tiny_model, tmp_path_factory.mktemp("vllm") / "inference.log") as (url, _):
        yield url


# Fixtures that start vLLM: a test that asks for one (directly or through another fixture) is marked
# `vllm`, so that the fast lane (scripts/test.sh --fast) leaves it out without a mark per test.
_VLLM_FIXTURES = {"vllm_server", "server"}


@functools.cache  # asked by the report header and by collection: nvidia-smi runs once
def gpu_visible() -> bool:
    """What scripts/setup.sh asks to install the GPU build: nvidia-smi lists a GPU."""
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _VLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.vllm)
    # The gpu lane cannot run here: deselected (counted in pytest's summary, named in the report's
    # header), not skipped one by one as if a check had been waived.
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu and not gpu_visible():
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]


def pytest_report_header(config: pytest.Config) -> str | None:
    return None if gpu_visible() else "gpu lane: no GPU visible (nvidia-smi -L), its tests are deselected"
