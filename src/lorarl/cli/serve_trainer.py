"""`python -m lorarl.cli.serve_trainer @ config.json`: `lorarl-serve`'s trainer process. It loads the base
model once (serve/engine.py), then takes operations from the API process on serve.trainer_port (serve/rpc.py)
until SIGTERM or SIGINT stops it: on 127.0.0.1, or where Ray placed it on its node's address
(LORARL_SERVE_TRAINER_HOST, which the launcher sets).

The launcher picks the port (serve.trainer_port > 0 here) and a key, handed over in the environment as
LORARL_SERVE_AUTHKEY (hex): only a process that holds it can send work. Bad input ends it with one line
and exit code 2: the config or the key before it loads anything, a port in use once the model is loaded.
"""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType

from lorarl.cli.common import exit_with, load_or_exit, setup_logging
from lorarl.config.serve import ServeConfig
from lorarl.exit_codes import BAD_INPUT, for_signal
from lorarl.serve.rpc import AUTHKEY_ENV, HOST_ENV, LOOPBACK, EngineError, serve_engine

log = logging.getLogger("lorarl.serve.trainer")


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived: a BaseException, as KeyboardInterrupt, so that no operation's failure
    handling (rpc.py answers Exceptions) takes it for the operation's."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


def authkey_from_env() -> bytes:
    """The key of LORARL_SERVE_AUTHKEY; ValueError, one line, if it is missing or not hex."""
    text = os.environ.get(AUTHKEY_ENV, "")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{AUTHKEY_ENV} is not hexadecimal") from None
    if len(key) < 16:
        raise ValueError(f"{AUTHKEY_ENV} must hold a key of at least 16 bytes (32 hex digits); the launcher sets it")
    return key


def main(argv: list[str] | None = None) -> None:
    cfg = load_or_exit(ServeConfig, argv)
    setup_logging("trainer")
    try:
        authkey = authkey_from_env()
    except ValueError as e:
        exit_with(e, BAD_INPUT)
    port = cfg.serve.trainer_port
    if port == 0:
        exit_with(ValueError("serve.trainer_port is 0: the trainer listens on the port the launcher picks"), BAD_INPUT)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    from lorarl.serve.engine import Engine

    try:
        serve_engine(Engine(cfg), (os.environ.get(HOST_ENV, LOOPBACK), port), authkey)
    except Stopped as e:
        log.info("%s: stopping", e)
        raise SystemExit(for_signal(e.signum)) from None
    except EngineError as e:
        exit_with(ValueError(f"serve.trainer_port {port}: {e}"), BAD_INPUT)


if __name__ == "__main__":
    main()
