"""A real `lorarl-serve` (the installed console script: its vLLM worker, its trainer process) on the
tiny model, for the tests that drive it with the stock `tinker` SDK; and how to start another one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import tinker
from safetensors.torch import load_file, save_file

from tests.conftest import free_port
from tests.integration.helpers import console_script

KEY = "tml-tenant-a"
OTHER_KEY = "tml-tenant-b"


@dataclass
class Server:
    url: str
    run_dir: Path
    config: Path
    proc: subprocess.Popen[bytes]

    def client(self, key: str = KEY) -> tinker.ServiceClient:
        return tinker.ServiceClient(base_url=self.url, api_key=key)


def serve_config(tiny_model: Path, out: Path, run_name: str) -> Path:
    cfg = {
        "seq_len": 128,
        "output_dir": str(out),
        "run_name": run_name,
        "model": {"name": str(tiny_model)},
        "trainer": {"micro_batch_size": 32},
        # The peaked model's logits are 4x larger, and so is float32's rounding between vLLM and the trainer:
        # after test_sdk's RL loop (lr 3e-2) a healthy adapter was 1.06e-2 off, over float32's default 1e-2.
        # A served base model is 9.5 off.
        "inference": {"port": free_port(), "kv_cache_gib": 1, "served_check_tolerance": 5e-2},
        "serve": {"port": free_port(), "max_rank": 16, "max_loras": 2, "long_poll": 5.0},
    }
    path = out / f"{run_name}.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


@contextlib.contextmanager
def running_server(config: Path, *flags: str, timeout: float = 300) -> Iterator[Server]:
    """`lorarl-serve @ config` until /healthz answers; stopped (SIGTERM) afterwards, and no process of it
    may outlive it."""
    cfg = json.loads(config.read_text())
    url = f"http://127.0.0.1:{cfg['serve']['port']}"
    log = config.with_suffix(".out")
    env = {**os.environ, "TINKER_TELEMETRY": "0"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([console_script("lorarl-serve"), "@", str(config), *flags],
                                stdout=out, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    run_dir = Path(cfg["output_dir"]) / cfg["run_name"]
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"lorarl-serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"lorarl-serve did not answer in {timeout} s:\n{log.read_text()[-4000:]}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=2)
                break
            time.sleep(1)
        yield Server(url, run_dir, config, proc)
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left running: {alive}"


@pytest.fixture(scope="session")
def peaked_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its embeddings (tied to the output head) scaled by 4. At the random
    initialisation's scale every next-token distribution is near uniform and the frozen head caps what
    a LoRA can move: an RL loop raised a reward from 0.10 to 0.16 in 20 steps and no further. Scaled,
    the distributions are as peaked as a trained model's and the same loop reaches 0.99 in 8 steps."""
    folder = tmp_path_factory.mktemp("models") / "tiny-qwen3-peaked"
    shutil.copytree(tiny_model, folder)
    weights = load_file(folder / "model.safetensors")
    weights["model.embed_tokens.weight"] *= 4
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="session")
def server(peaked_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One lorarl-serve for the module's tests (its start costs a vLLM worker's and a trainer's)."""
    out = tmp_path_factory.mktemp("serve")
    with running_server(serve_config(peaked_model, out, "shared")) as s:
        yield s
