"""Faults injected into real runs: processes killed with SIGKILL at a seeded random step, and a
server that answers HTTP 500. Each run must still finish every step, each trainer step logged once."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiohttp import web

from tests.conftest import free_port
from tests.integration.helpers import rl_command, rl_config, run_rl, steps_logged, wait_for_trainer_steps, write_config

pytestmark = pytest.mark.integration
SEED = 1234


def process_of(proc: subprocess.Popen[str], module: str) -> psutil.Process:
    (found,) = (p for p in psutil.Process(proc.pid).children() if module in " ".join(p.cmdline()))
    return found


@pytest.mark.parametrize("role", ["trainer", "orchestrator"])
def test_a_killed_role_resumes_from_the_latest_checkpoint(
    tiny_model: Path, vllm_server: str, tmp_path: Path, role: str
) -> None:
    cfg = rl_config(tiny_model, tmp_path, role, max_steps=4, **{"inference.urls": [vllm_server]})
    cfg["trainer"]["ckpt"] = {"interval": 1, "keep_last": 2}
    kill_after = random.Random(f"{SEED}-{role}").choice([1, 2])
    proc = subprocess.Popen(rl_command(write_config(cfg, tmp_path / "rl.json"), "--auto_resume", "1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    run = tmp_path / role
    try:
        wait_for_trainer_steps(proc, run, kill_after)
        process_of(proc, f"lorarl.cli.{role}").kill()
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "(auto_resume)" in err
    assert steps_logged(run, "trainer") == [1, 2, 3, 4]
    assert steps_logged(run, "orchestrator") == [1, 2, 3, 4]
    assert sorted(int(line.split("/")[0].split()[-1]) for line in out.splitlines() if line.startswith("step")) == [
        1, 2, 3, 4
    ]  # fmt: skip


def test_the_whole_tree_killed_at_once_then_resume(tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    """As a machine crash or a preempted node would: every process gets SIGKILL at the same moment."""
    cfg = rl_config(tiny_model, tmp_path, "crash", max_steps=4, **{"inference.urls": [vllm_server]})
    cfg["trainer"]["ckpt"] = {"interval": 1}
    config = write_config(cfg, tmp_path / "rl.json")
    proc = subprocess.Popen(rl_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "crash"
    try:
        wait_for_trainer_steps(proc, run, random.Random(SEED).choice([1, 2]))
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for p in tree:
            p.send_signal(signal.SIGKILL)
        psutil.wait_procs(tree, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    again = run_rl(config)  # neither --resume nor --overwrite: refused, nothing touched
    assert again.returncode == 2 and "--resume" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    resumed = run_rl(config, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps_logged(run, "trainer") == [1, 2, 3, 4]
    assert steps_logged(run, "orchestrator") == [1, 2, 3, 4]
    assert list(run.glob("logs/previous-*/trainer.log"))  # the crashed run's logs are kept


FORWARDED = {"Content-Type", "Authorization"}


class FailingProxy:
    """A loopback proxy in front of a real vLLM server that answers every `every`-th completion
    request with HTTP 500, as an overloaded or failing server would."""

    def __init__(self, upstream: str, every: int) -> None:
        self.upstream, self.every = upstream, every
        self.completions = self.injected = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/completions":
            self.completions += 1
            if self.completions % self.every == 0:
                self.injected += 1
                return web.Response(status=500, text="injected failure")
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                data=await request.read(),
                headers={k: v for k, v in request.headers.items() if k in FORWARDED},
            ) as resp,
        ):
            return web.Response(status=resp.status, body=await resp.read(), content_type=resp.content_type)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> FailingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def failing_proxy(vllm_server: str) -> Iterator[FailingProxy]:
    with FailingProxy(vllm_server, every=5) as proxy:
        yield proxy


def test_a_server_answering_500_is_routed_around(tiny_model: Path, failing_proxy: FailingProxy, tmp_path: Path) -> None:
    cfg = rl_config(tiny_model, tmp_path, "flaky", max_steps=3, **{"inference.urls": [failing_proxy.url]})
    cfg["trainer"]["keep_rollouts"] = False  # the default: each batch goes once trained on
    result = run_rl(write_config(cfg, tmp_path / "rl.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert not list((tmp_path / "flaky" / "rollouts").iterdir())
    assert failing_proxy.injected >= 2
    assert steps_logged(tmp_path / "flaky", "trainer") == [1, 2, 3]
    log = (tmp_path / "flaky" / "logs" / "orchestrator.log").read_text()
    # Failures that land while the worker is already out of routing take it out only once.
    assert 0 < log.count("taking http") <= failing_proxy.injected and "back in routing" in log
