"""lorarl-serve's trainer process, started as the launcher starts it (`python -m lorarl.cli.serve_trainer`),
driven over its channel: results, BadRequest and EngineError cross as they are, a wrong key or no
trainer is one line, SIGTERM stops it and leaves no process."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from lorarl.exit_codes import BAD_INPUT, for_signal
from lorarl.serve.ops import (
    AdamParams,
    BadRequest,
    CreateTenant,
    Datum,
    ForwardBackward,
    ForwardBackwardResult,
    LoraSpec,
    OptimStep,
)
from lorarl.serve.rpc import AUTHKEY_ENV, EngineClient, EngineError, connect, serve_engine
from tests.conftest import free_port

DATUM = Datum(tokens=[5, 6, 7], targets=[6, 7, 8], weights=[1.0, 1.0, 1.0])


def write_config(tiny_model: Path, tmp_path: Path, port: int) -> Path:
    path = tmp_path / "serve.json"
    cfg = {"model": {"name": str(tiny_model)}, "output_dir": str(tmp_path), "seq_len": 64,
           "serve": {"trainer_port": port}, "trainer": {"num_threads": 1}}  # fmt: skip
    path.write_text(json.dumps(cfg))
    return path


def start(config: Path, key: str | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != AUTHKEY_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3] / "src"), env.get("PYTHONPATH", "")])
    if key is not None:
        env[AUTHKEY_ENV] = key
    return subprocess.Popen([sys.executable, "-m", "lorarl.cli.serve_trainer", "@", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.fixture
def trainer(tiny_model: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], EngineClient, str]]:
    """The trainer process, a client connected to it, and its key (hex)."""
    port, key = free_port(), secrets.token_hex(16)
    proc = start(write_config(tiny_model, tmp_path, port), key)
    try:
        client = connect(("127.0.0.1", port), bytes.fromhex(key), timeout=120)
        yield proc, client, key
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


class Echo:
    """An engine whose result is the operation it was given."""

    def run(self, op: object) -> object:
        return op


def test_a_large_operation_crosses_without_waiting_for_the_other_ends_acknowledgement() -> None:
    """Nagle's algorithm is off at both ends: with it on, each message over 16 KiB (a forward_backward's
    datums, its results) waited up to 40 ms for the other end's delayed ACK; 45 ms of idle trainer a request."""
    address, key = ("127.0.0.1", free_port()), secrets.token_bytes(16)
    threading.Thread(target=serve_engine, args=(Echo(), address, key), daemon=True).start()
    client = connect(address, key, timeout=10)
    with socket.socket(fileno=os.dup(client._conn.fileno())) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    op = ForwardBackward("m", (Datum(tokens=list(range(10_000)), targets=list(range(10_000))),), "cross_entropy")
    seconds = []
    for _ in range(11):
        start = time.perf_counter()
        assert client.call(op) == op  # type: ignore[call-overload]
        seconds.append(time.perf_counter() - start)
    client.close()
    assert statistics.median(seconds) < 0.02, seconds  # with the delay: 40 ms or more each way


@pytest.mark.slow
def test_operations_cross_the_channel_and_sigterm_stops_the_trainer(
    trainer: tuple[subprocess.Popen[str], EngineClient, str],
) -> None:
    proc, client, key = trainer
    assert client.call(CreateTenant("m", LoraSpec(rank=4, seed=1))) is None
    result = client.call(ForwardBackward("m", (DATUM, DATUM), "cross_entropy"))
    assert isinstance(result, ForwardBackwardResult) and len(result.logprobs) == 2
    assert result.metrics["loss:sum"] == pytest.approx(-sum(sum(lp) for lp in result.logprobs))
    assert client.call(OptimStep("m", AdamParams(learning_rate=1e-2))).metrics["learning_rate"] == 1e-2
    after = asyncio.run(client.acall(ForwardBackward("m", (DATUM,), "cross_entropy", forward_only=True)))
    assert after.logprobs[0] != result.logprobs[0]  # the step changed the adapter

    with pytest.raises(BadRequest, match=r"^loss_fn 'dro' is not served here"):
        client.call(ForwardBackward("m", (DATUM,), "dro"))
    with pytest.raises(EngineError, match=r"^str failed on the trainer: TypeError: not an operation") as caught:
        client.call("not an operation")  # type: ignore[call-overload]
    assert "\n" not in str(caught.value)
    assert client.call(OptimStep("m", AdamParams())).metrics["grad_norm"] == 0.0  # it still serves

    with pytest.raises(EngineError, match=r"refused the key \(LORARL_SERVE_AUTHKEY\)"):
        connect(client.address, bytes.fromhex(key)[::-1], timeout=5)
    assert client.call(OptimStep("m", AdamParams())).metrics["grad_norm"] == 0.0  # a stranger changed nothing

    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == for_signal(signal.SIGTERM), stderr
    assert stderr.strip().splitlines()[-1].endswith("trainer INFO SIGTERM: stopping"), stderr  # no traceback
    assert "TypeError: not an operation" in stderr  # the EngineError's traceback went to the log
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    with pytest.raises(EngineError, match=r"^the trainer at 127\.0\.0\.1:\d+ is gone"):
        client.call(OptimStep("m", AdamParams()))


def test_connect_names_the_address_where_no_trainer_listens() -> None:
    port = free_port()
    with pytest.raises(EngineError, match=rf"^no trainer answers on 127\.0\.0\.1:{port} after 0\.5 s"):
        connect(("127.0.0.1", port), b"k" * 16, timeout=0.5)


@pytest.mark.parametrize(
    ("port", "key", "message"),
    [
        (0, "ab" * 16, "serve.trainer_port is 0"),
        (1, None, f"{AUTHKEY_ENV} must hold a key of at least 16 bytes"),
        (1, "not hex", f"{AUTHKEY_ENV} is not hexadecimal"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    tiny_model: Path, tmp_path: Path, port: int, key: str | None, message: str
) -> None:
    proc = start(write_config(tiny_model, tmp_path, port), key)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == BAD_INPUT
    assert stderr.strip().splitlines()[-1].startswith(f"error: {message}"), stderr
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_a_port_in_use_is_one_line(tiny_model: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = start(write_config(tiny_model, tmp_path, port), secrets.token_hex(16))
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == BAD_INPUT
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: serve.trainer_port {port}: cannot listen on 127.0.0.1:{port}: "), stderr
