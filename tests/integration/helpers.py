"""Run `rl` as a user would, as a subprocess with a config file, and read what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import API_KEY


def rl_config(tiny_model: Path, out: Path, run_name: str, **overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "max_steps": 3,
        "seq_len": 128,
        "output_dir": str(out),
        "run_name": run_name,
        "model": {"name": str(tiny_model), "lora": {"rank": 8, "alpha": 16}},
        "trainer": {"optim": {"lr": 1e-3}, "keep_rollouts": True},  # tests read the batches
        "orchestrator": {
            "batch_size": 16,
            "rollouts_per_example": 4,
            "max_async_level": 0,
            "sampling": {"temperature": 0.7, "max_tokens": 12},
        },
        "inference": {"api_key": API_KEY},
        "monitor": {"console": True},
    }
    for key, value in overrides.items():
        section = cfg
        *parents, last = key.split(".")
        for p in parents:
            section = section.setdefault(p, {})
        section[last] = value
    return cfg


def write_config(cfg: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(cfg, indent=2))
    return path


def console_script(name: str) -> str:
    """The installed command (`rl`, `sft`, ...) of the environment running the tests, as users run it."""
    return str(Path(sys.executable).parent / name)


def rl_command(config: Path, *flags: str) -> list[str]:
    return [console_script("rl"), "@", str(config), *flags]


def run_rl(config: Path, *flags: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(rl_command(config, *flags), capture_output=True, text=True, timeout=timeout)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_logged(run_dir: Path, component: str) -> list[int]:
    return sorted(r["step"] for r in metrics(run_dir) if r["component"] == component)


def wait_for_trainer_steps(proc: subprocess.Popen[str], run_dir: Path, steps: int, timeout: float = 400) -> None:
    """Until the trainer of the running `rl` has logged `steps` steps; fails if `rl` exits first."""
    deadline = time.monotonic() + timeout
    while not ((run_dir / "metrics.jsonl").exists() and len(steps_logged(run_dir, "trainer")) >= steps):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, f"rl did not reach step {steps}"
        time.sleep(0.5)


def models_request(url: str) -> urllib.request.Request:
    """GET /v1/models of a test server, with its key."""
    return urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})


class ModelListWatcher:
    """Polls GET /v1/models in the background and remembers every model id it saw."""

    def __init__(self, url: str, interval: float = 0.05) -> None:
        self.url, self.interval = url, interval
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(models_request(self.url), timeout=5) as r:
                    self.seen |= {m["id"] for m in json.load(r)["data"]}
            except OSError:
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> ModelListWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
