"""Faults of the inference servers, injected into real runs of the installed `rl`: two runs of the same
run_name started together on one shared server, and one worker of two frozen (SIGSTOP) mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import serve_vllm
from tests.integration.helpers import (
    metrics,
    models_request,
    rl_command,
    rl_config,
    steps_logged,
    wait_for_trainer_steps,
    write_config,
)

pytestmark = pytest.mark.integration
REFUSED = "which is still going: give this run another run_name"


def served_roots(url: str) -> dict[str, str]:
    """Every adapter the server serves: name -> the folder it was loaded from."""
    try:
        with urllib.request.urlopen(models_request(url), timeout=5) as r:
            return {m["id"]: m["root"] for m in json.load(r)["data"] if m.get("parent")}
    except OSError:
        return {}


def test_two_runs_of_one_name_never_sample_with_each_others_adapters(
    tiny_model: Path, vllm_server: str, tmp_path: Path
) -> None:
    """Started together in two folders: each finishes on its own adapters, or one is refused in one
    line; no adapter of a run still going is ever replaced by the other's."""
    procs: dict[Path, subprocess.Popen[str]] = {}
    for folder in ("a", "b"):
        cfg = rl_config(tiny_model, tmp_path / folder, "same", max_steps=2, **{"inference.urls": [vllm_server]})
        config = write_config(cfg, tmp_path / f"{folder}.json")
        procs[(tmp_path / folder / "same").resolve()] = subprocess.Popen(
            rl_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
    try:
        watch_until_both_end(vllm_server, procs)
    finally:  # on a failure: rl stops its children on SIGTERM
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(60)
    errors = {run: p.stderr.read() if p.stderr else "" for run, p in procs.items()}
    finished = [run for run, p in procs.items() if p.returncode == 0]
    assert finished, errors
    for run in finished:
        assert steps_logged(run, "trainer") == [1, 2], errors[run]
    for run in procs.keys() - finished:  # refused: its orchestrator found the name served for the other
        log = (run / "logs" / "orchestrator.log").read_text()
        assert REFUSED in log and REFUSED in errors[run], errors[run]
        assert procs[run].returncode == 2 and "Traceback" not in errors[run], errors[run]  # one line, as bad input


def watch_until_both_end(url: str, procs: dict[Path, subprocess.Popen[str]]) -> None:
    """Follow the server's adapters until both runs end; fails as soon as an adapter of a run still
    going is seen loaded from the other run's folder."""
    owners: dict[str, Path] = {}  # adapter name -> the run folder it was last seen loaded from
    deadline = time.monotonic() + 400
    while any(p.poll() is None for p in procs.values()):
        assert time.monotonic() < deadline, "the runs did not end"
        for name, root in served_roots(url).items():
            if not name.startswith("same-"):
                continue  # another test's, on the shared server
            run = Path(root).parents[1]
            if run not in procs:
                continue  # left by an earlier run of this name, which each of these unloads as it starts
            alive = name in owners and procs[owners[name]].poll() is None
            assert not (alive and owners[name] != run), f"{name} of {owners[name]}, still going, replaced by {run}'s"
            owners[name] = run
        time.sleep(0.05)


@pytest.fixture
def second_server(tiny_model: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with serve_vllm(tiny_model, tmp_path / "second-server.log") as server:
        yield server


def test_a_frozen_worker_of_two_is_routed_around_and_logged(
    tiny_model: Path, vllm_server: str, second_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """SIGSTOP stops the second server's whole process group (API server and engine) after step 1:
    the run finishes on the first one while it stays frozen, and says so."""
    frozen_url, frozen = second_server
    cfg = rl_config(tiny_model, tmp_path, "frozen", max_steps=3, **{"inference.urls": [vllm_server, frozen_url]})
    # A stall is noticed after 5 s + 12 tokens at 4 tokens/s: 8 s, not the 600 s of a fixed timeout.
    cfg["inference"] |= {"request_timeout": 5.0, "min_tokens_per_s": 4.0}
    proc = subprocess.Popen(rl_command(write_config(cfg, tmp_path / "rl.json")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    run = tmp_path / "frozen"
    try:
        wait_for_trainer_steps(proc, run, 1)
        os.killpg(frozen.pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=300)  # while it stays frozen
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert steps_logged(run, "trainer") == [1, 2, 3]
    log = (run / "logs" / "orchestrator.log").read_text()
    assert f"{frozen_url} stalled, taking it out of routing (1 of 2 worker(s) left)" in log, log[-3000:]
    stalls = [r.get("inference/stalls", 0) for r in metrics(run) if r["component"] == "orchestrator"]
    assert sum(stalls) == 1, stalls
    assert "| stalled workers 1 |" in out, out
