"""Faults to the processes of a run, through the installed `rl`: a worker's vLLM server killed, a
SIGTERM to `rl`, a frozen trainer, a lost Ray node, a Ray address where nothing answers. Each checks what the run
says and that nothing it started outlives it: every process started by `rl`, directly or not, carries
a token in its environment, and none may be left once `rl` has exited."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from lorarl.launcher.supervisor import group_members
from tests.conftest import free_port
from tests.integration.helpers import rl_command, rl_config, run_rl, steps_logged, wait_for_trainer_steps, write_config

pytestmark = pytest.mark.integration
TOKEN = "LORARL_TEST_RUN_TOKEN"
STALL_STOP = 40  # s with no step before rl stops a run with a frozen trainer: more than its start takes


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` still running (zombies, already dead, left out)."""
    live = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                live.append(p)
    return live


def started_by(token: str) -> list[psutil.Process]:
    """The running processes whose environment carries `token`: every one `rl` started, however deep."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get(TOKEN) == token:
                found.append(p)
    return alive(found)


class Rl:
    """`rl @ config` running, its stderr in a file (read while it runs), its environment marked."""

    def __init__(self, config: Path, tmp_path: Path, *flags: str) -> None:
        self.token = uuid.uuid4().hex
        self.stderr = tmp_path / "rl.stderr"
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                rl_command(config, *flags),
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
                env={**os.environ, TOKEN: self.token},
            )

    def err(self) -> str:
        return self.stderr.read_text()

    def wait_for(self, text: str, count: int = 1, timeout: float = 600) -> None:
        """Until `text` appears `count` times in rl's stderr."""
        deadline = time.monotonic() + timeout
        while self.err().count(text) < count:
            assert self.proc.poll() is None, self.err()[-3000:]
            assert time.monotonic() < deadline, f"no {text!r} in rl's stderr"
            time.sleep(0.5)

    def child(self, module: str) -> psutil.Process:
        (found,) = (p for p in psutil.Process(self.proc.pid).children() if module in " ".join(p.cmdline()))
        return found


@pytest.fixture
def cleanup() -> Iterator[list[Rl]]:
    """Kills what a failed test left running."""
    runs: list[Rl] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
        for p in started_by(run.token):
            p.kill()


def test_a_killed_vllm_server_leaves_no_engine_and_the_run_finishes(
    tiny_model: Path, tmp_path: Path, cleanup: list[Rl]
) -> None:
    """SIGKILL to the server process alone leaves its engine core in its process group; `rl` stops that
    group before the restart, and the run finishes on the restarted worker."""
    cfg = rl_config(tiny_model, tmp_path, "respawn", **{"inference.port": free_port()})
    cfg["inference"]["unavailable_timeout"] = 900  # a vLLM start on a shared 2-core machine takes minutes
    rl = Rl(write_config(cfg, tmp_path / "rl.json"), tmp_path)
    cleanup.append(rl)
    wait_for_trainer_steps(rl.proc, tmp_path / "respawn", 1, timeout=600)
    server = rl.child("vllm.entrypoints.openai.api_server")
    pgid = os.getpgid(server.pid)
    engine = [p for p in group_members(pgid) if p.pid != server.pid]
    assert engine, "vLLM's server has no other process in its group: nothing to leak"
    server.kill()
    rl.wait_for("started inference-0", count=2)  # the restart
    assert not alive(engine), [p.cmdline() for p in alive(engine)]
    assert not group_members(pgid)
    err = rl.err()
    assert "inference-0 exited with code -9; restart 1 of 3" in err
    assert "inference-0: stopped" in err and "its previous run left in its process group" in err
    assert rl.proc.wait(timeout=900) == 0, rl.err()[-3000:]
    assert steps_logged(tmp_path / "respawn", "trainer") == [1, 2, 3]
    assert not started_by(rl.token), [p.cmdline() for p in started_by(rl.token)]


def test_sigterm_stops_every_process_and_exits_143(
    tiny_model: Path, vllm_server: str, tmp_path: Path, cleanup: list[Rl]
) -> None:
    cfg = rl_config(tiny_model, tmp_path, "term", max_steps=1000, **{"inference.urls": [vllm_server]})
    rl = Rl(write_config(cfg, tmp_path / "rl.json"), tmp_path)
    cleanup.append(rl)
    wait_for_trainer_steps(rl.proc, tmp_path / "term", 1)
    children = [rl.child("lorarl.cli.trainer"), rl.child("lorarl.cli.orchestrator")]
    assert all(p.environ()[TOKEN] == rl.token for p in children)  # what started_by finds
    rl.proc.send_signal(signal.SIGTERM)
    assert rl.proc.wait(timeout=120) == 143, rl.err()[-3000:]
    assert "SIGTERM: stopping every process of the run" in rl.err()
    assert not started_by(rl.token), [p.cmdline() for p in started_by(rl.token)]


def test_a_frozen_trainer_is_named_on_the_console_and_the_run_stops_after_stall_stop(
    tiny_model: Path, vllm_server: str, tmp_path: Path, cleanup: list[Rl]
) -> None:
    """SIGSTOP to the trainer after step 1: every process stays alive, so no exit code shows it; the
    watchdog names the trainer in one line, then stops the run, the frozen trainer included."""
    cfg = rl_config(tiny_model, tmp_path, "frozen", max_steps=1000, **{"inference.urls": [vllm_server]})
    # The wait counts from the start too: the trainer's start (the step 0 adapter the orchestrator samples
    # with) took 25 s on a loaded 2-core machine, and a stall_stop of 12 s stopped the run before step 1.
    cfg["monitor"] = {"stall_warning": 4, "stall_stop": STALL_STOP}
    rl = Rl(write_config(cfg, tmp_path / "rl.json"), tmp_path)
    cleanup.append(rl)
    wait_for_trainer_steps(rl.proc, tmp_path / "frozen", 1)
    rl.child("lorarl.cli.trainer").send_signal(signal.SIGSTOP)
    assert rl.proc.wait(timeout=120) == 1, rl.err()[-3000:]
    # (the start may be said too: the orchestrator waits for its first batch for more than 4 s here)
    warned = [line for line in rl.err().splitlines() if "no step for" in line and "waiting on the trainer" in line]
    assert len(warned) >= 2, rl.err()[-3000:]
    assert "(monitor.stall_warning 4 s)" in warned[0] and "trainer.log last written" in warned[0]
    assert warned[-1].endswith(f"stopping the run (monitor.stall_stop {STALL_STOP} s)")
    assert not started_by(rl.token), [p.cmdline() for p in started_by(rl.token)]


def test_a_lost_ray_node_stops_the_run_in_one_line_that_says_resume(tiny_model: Path, tmp_path: Path) -> None:
    """The vLLM worker's node goes away mid-run: no restart is promised on it, one line names the node
    and --resume, and nothing of the run is left on the nodes that remain. The lost node's vLLM is told
    to stop as its actor dies (the parent-death signal): all a run can do for a node it lost; how fast
    vLLM then exits is vLLM's (once, on CI, not within 30 s)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1, resources={"trainer_node": 1})
        node = cluster.add_node(num_cpus=1, resources={"inference_node": 1})
        cluster.wait_for_nodes()
        cfg = rl_config(tiny_model, tmp_path, "lost", max_steps=1000, **{"inference.port": free_port()})
        cfg["cluster"] = {
            "backend": "ray",
            "address": cluster.address,
            "trainer_resources": {"trainer_node": 1},
            "inference_resources": {"inference_node": 1},
        }
        config = write_config(cfg, tmp_path / "rl.json")
        proc = subprocess.Popen(rl_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_for_trainer_steps(proc, tmp_path / "lost", 1)
            vllm_mark = f"--port {cfg['inference']['port']} "
            marks = (f"{tmp_path}/", vllm_mark)  # the trainer's and orchestrator's config, vLLM's port
            roots = [p for p in psutil.process_iter() if any(m in " ".join(safe_cmdline(p)) for m in marks)]
            placed = [q for p in roots for q in [p, *p.children(recursive=True)]]
            on_lost_node = [
                q for p in roots if vllm_mark in " ".join(safe_cmdline(p)) for q in [p, *p.children(recursive=True)]
            ]
            assert on_lost_node
            cluster.remove_node(node)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1, err[-3000:]
        (line,) = [line for line in err.splitlines() if "is lost" in line]
        assert f"inference-0: its Ray node {node.node_id[:12]}" in line and "--resume" in line
        assert "restart 1 of" not in err and "Traceback" not in err and "class_name" not in err
        gone, left = psutil.wait_procs([p for p in placed if p not in on_lost_node], timeout=30)
        assert not alive(left), [p.cmdline() for p in alive(left)]
        worker_log = (tmp_path / "lost" / "logs" / "inference-0.log").read_text(errors="replace")
        assert "[shutdown] API server: shutdown triggered" in worker_log, worker_log[-3000:]
        gone, left = psutil.wait_procs(on_lost_node, timeout=60)
        for p in alive(left):  # not to slow the tests that follow
            p.kill()
    finally:
        cluster.shutdown()


def safe_cmdline(p: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return p.cmdline()
    return []


def test_a_ray_address_where_nothing_answers_is_one_line(tiny_model: Path, tmp_path: Path) -> None:
    """Ray itself would print connection warnings for minutes, deaf to SIGTERM."""
    port = free_port()  # nothing listens there
    cfg = rl_config(tiny_model, tmp_path, "nowhere", **{"inference.port": free_port()})
    cfg["cluster"] = {"backend": "ray", "address": f"127.0.0.1:{port}", "connect_timeout": 5}
    result = run_rl(write_config(cfg, tmp_path / "rl.json"), timeout=120)
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if "ERROR" in line or "error" in line]
    assert f"cluster.address 127.0.0.1:{port}: no Ray cluster answers there" in line
    assert "cluster.connect_timeout = 5 s" in line
    assert "Traceback" not in result.stderr and "GCS" not in result.stderr
