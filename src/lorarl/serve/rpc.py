"""The channel between `lorarl-serve`'s API process and its trainer process (cli/serve_trainer.py): the
API sends an operation of ops.py, the trainer runs it on its engine and sends back the result.

multiprocessing.connection carries pickled objects over a socket and authenticates both ends with a
shared key (HMAC challenge), so no other local process can hand the trainer work or a pickle. The
trainer answers one connection at a time, one operation at a time, in order: the engine holds one
model. A request the engine cannot serve comes back as the same `BadRequest`; any other failure as an
`EngineError` of one line, its traceback in the trainer's log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing import Pipe
from multiprocessing.connection import Client, Connection, Listener, wait
from multiprocessing.context import AuthenticationError
from typing import TYPE_CHECKING, overload

from lorarl.serve.ops import (
    BadRequest,
    CreateTenant,
    DropTenant,
    ForwardBackward,
    ForwardBackwardResult,
    LoadState,
    Op,
    OptimStep,
    OptimStepResult,
    SaveForSampler,
    SaveState,
)

if TYPE_CHECKING:  # the API process imports this module without torch
    from lorarl.serve.engine import Engine

# The environment variable in which the launcher hands the trainer process the channel's key (hex).
AUTHKEY_ENV = "LORARL_SERVE_AUTHKEY"
# ... and the address it listens on: loopback, or its node's where Ray placed it (the key guards it).
HOST_ENV = "LORARL_SERVE_TRAINER_HOST"
LOOPBACK = "127.0.0.1"

log = logging.getLogger("lorarl.serve.rpc")

Address = tuple[str, int]
Result = ForwardBackwardResult | OptimStepResult | None


class EngineError(RuntimeError):
    """The trainer failed at an operation (not the request's doing), or cannot be reached; str() is one line."""


def serve_engine(engine: Engine, address: Address, authkey: bytes) -> None:
    """Listen on `address` and run the operations that clients with `authkey` send, one at a time in this
    thread (the engine's), until the process is stopped. A thread accepts and authenticates connections
    meanwhile, so that a client that comes (a restarted API, a stranger with the wrong key) never waits
    for one that stays. EngineError if it cannot listen there."""
    try:
        listener = Listener(address, authkey=authkey)
    except OSError as e:
        raise EngineError(f"cannot listen on {_where(address)}: {e.strerror or e}") from None
    accepted: queue.SimpleQueue[Connection] = queue.SimpleQueue()
    arrived, wake = Pipe(duplex=False)  # a byte on `wake` for each connection put in `accepted`
    closing = threading.Event()
    accepting = threading.Thread(
        target=_accept, args=(listener, accepted, wake, closing), name="rpc-accept", daemon=True
    )
    accepting.start()
    log.info("taking work on %s:%d", *address)
    clients: list[Connection] = []
    try:
        while True:
            for ready in wait([arrived, *clients]):
                if ready is arrived:
                    arrived.recv_bytes()
                    clients.append(accepted.get())
                    continue
                assert isinstance(ready, Connection)
                try:
                    op = ready.recv()
                    ready.send(_answer(engine, op))
                except (EOFError, OSError):
                    log.info("a client closed its connection")
                    clients.remove(ready)
                    ready.close()
    finally:
        closing.set()
        listener.close()
        for conn in clients:
            conn.close()


def _accept(
    listener: Listener, accepted: queue.SimpleQueue[Connection], wake: Connection, closing: threading.Event
) -> None:
    while not closing.is_set():
        try:
            conn = listener.accept()
        except (AuthenticationError, EOFError, OSError) as e:  # a stranger, a client gone mid-handshake, or closed
            if not closing.is_set():
                log.warning("refused a connection: %s", e or type(e).__name__)
            continue
        accepted.put(without_delay(conn))
        wake.send_bytes(b"")


def _answer(engine: Engine, op: Op) -> Result | Exception:
    try:
        return engine.run(op)
    except BadRequest as e:
        return BadRequest(_one_line(str(e)))
    except Exception as e:
        log.exception("%s failed", type(op).__name__)
        return EngineError(_one_line(f"{type(op).__name__} failed on the trainer: {type(e).__name__}: {e}"))


def _one_line(text: str) -> str:
    return " ".join(text.split())


class EngineClient:
    """The API's end of the channel: `call` blocks (threads take turns), `acall` runs it in a thread."""

    def __init__(self, conn: Connection, address: Address) -> None:
        self._conn = conn
        self.address = address
        self._lock = threading.Lock()

    @overload
    def call(self, op: ForwardBackward) -> ForwardBackwardResult: ...
    @overload
    def call(self, op: OptimStep) -> OptimStepResult: ...
    @overload
    def call(self, op: CreateTenant | SaveState | LoadState | SaveForSampler | DropTenant) -> None: ...
    def call(self, op: Op) -> Result:
        """The engine's result of `op`; its BadRequest, or EngineError (also when the trainer is gone)."""
        with self._lock:
            try:
                self._conn.send(op)
                answer = self._conn.recv()
            except (EOFError, OSError) as e:
                raise EngineError(f"the trainer at {_where(self.address)} is gone ({e or type(e).__name__})") from None
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    @overload
    async def acall(self, op: ForwardBackward) -> ForwardBackwardResult: ...
    @overload
    async def acall(self, op: OptimStep) -> OptimStepResult: ...
    @overload
    async def acall(self, op: CreateTenant | SaveState | LoadState | SaveForSampler | DropTenant) -> None: ...
    async def acall(self, op: Op) -> Result:
        """`call` in the event loop's default thread pool."""
        return await asyncio.get_running_loop().run_in_executor(None, self.call, op)  # type: ignore[arg-type]

    def close(self) -> None:
        self._conn.close()


def connect(address: Address, authkey: bytes, timeout: float, alive: Callable[[], bool] = lambda: True) -> EngineClient:
    """A client of the trainer at `address`, tried again until it listens (it loads the model first),
    `timeout` seconds pass or `alive()` turns false (its process died): then EngineError naming the address."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return EngineClient(without_delay(Client(address, authkey=authkey)), address)
        except AuthenticationError:
            raise EngineError(f"the trainer at {_where(address)} refused the key (LORARL_SERVE_AUTHKEY)") from None
        except (OSError, EOFError) as e:
            if time.monotonic() >= deadline or not alive():
                raise EngineError(f"no trainer answers on {_where(address)} after {timeout:g} s ({e})") from None
            time.sleep(0.1)


def without_delay(conn: Connection) -> Connection:
    """`conn` with TCP_NODELAY: multiprocessing sends a message over 16 KiB in two writes (its length, then
    its body), and Nagle's algorithm holds the second until the first is acknowledged, which the other end
    delays by up to 40 ms. Measured before: 45 ms of idle trainer on every forward_backward (its datums)
    and every optim_step (after the forward_backward's results came back)."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # the same socket; closing the copy leaves it open
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _where(address: Address) -> str:
    return f"{address[0]}:{address[1]}"
