"""What every entry point does first: load its config or explain why not, and set up logging; and how
each ends on what it cannot go on with: one line, no traceback."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

from pydantic import BaseModel

from lorarl.config.common import expand_user
from lorarl.config.loader import ConfigError, load_config, load_run
from lorarl.exit_codes import BAD_INPUT, for_signal
from lorarl.written_files import record_written

T = TypeVar("T", bound=BaseModel)
M = TypeVar("M", bound=BaseModel)


class Main(Protocol):
    """A command's entry point: its arguments, or None for the command line's."""

    def __call__(self, argv: list[str] | None = None) -> None: ...


def load_or_exit(cls: type[T], argv: list[str] | None) -> T:
    try:
        return load_config(cls, argv)
    except ConfigError as e:
        exit_with(e, BAD_INPUT)


def load_run_or_exit(cls: type[T], mode_cls: type[M], argv: list[str] | None) -> tuple[T, M]:
    """The experiment and the run-mode flags (--dry-run, --overwrite, ...) of `argv`."""
    try:
        return load_run(cls, mode_cls, argv)
    except ConfigError as e:
        exit_with(e, BAD_INPUT)


def exit_with(error: Exception, code: int) -> NoReturn:
    """Exit `code` with the one line `error: <error>`. Under torchrun every rank ends so (they read the
    same data and hold the same numbers), and rank 0 alone says it."""
    if _speaks_for_the_ranks():
        print(f"error: {error}", file=sys.stderr)
    raise SystemExit(code)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser for the commands without a config (lorarl-merge, lorarl-plot), whose mistakes
    are one line as every command's are (`error: command line: ...`), not a usage block and a second
    line; --help shows the usage."""

    def error(self, message: str) -> NoReturn:
        exit_with(ValueError(f"command line: {message} (see {self.prog} --help)"), BAD_INPUT)


def user_path(value: str) -> Path:
    """argparse's `type` for a path flag: "~" expanded as a shell would (config.common.expand_user); an
    empty value or a "~user" this machine lacks is refused with the flag's name, not taken for the working
    directory (Path("") is ".") or a folder named "~user"."""
    try:
        return Path(expand_user(value))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def setup_logging(component: str) -> None:
    """Progress (INFO) from rank 0 alone under torchrun; warnings from every rank."""
    logging.basicConfig(
        level=os.environ.get("LORARL_LOG_LEVEL", "INFO" if _speaks_for_the_ranks() else "WARNING"),
        format=_format(component),
        datefmt="%H:%M:%S",
    )


def also_log_to(path: Path, component: str) -> None:
    """This process's log lines go to `path` too (appended, recorded as lorarl's), as they go to the
    console: for a process that no launcher logs for, `lorarl-serve`'s API (logs/serve.log). `path` is
    in a run folder that `prepare` found free of links."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(_format(component), "%H:%M:%S"))
    logging.getLogger().addHandler(handler)
    record_written(path)


def _format(component: str) -> str:
    return f"%(asctime)s {component} %(levelname)s %(message)s"


def _speaks_for_the_ranks() -> bool:
    """Not one of torchrun's ranks, or its rank 0: torchrun's ranks share a terminal (and in `rl` the
    trainer's log), so what every rank would say alike is said once."""
    return "TORCHELASTIC_RUN_ID" not in os.environ or os.environ.get("RANK") == "0"


def ctrl_c_in_one_line(command: str) -> Callable[[Main], Main]:
    """`command`'s main, ended by Ctrl-C before it has a handler of its own (while it checks, say) in
    one line and exit code 130, not a KeyboardInterrupt's traceback. What it started by then stopped
    on the way out (the launcher's `finally`)."""

    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> None:
            try:
                main(argv)
            except KeyboardInterrupt:
                print(f"{command}: stopped by SIGINT", file=sys.stderr, flush=True)
                raise SystemExit(for_signal(signal.SIGINT)) from None

        return run

    return wrap


def stop_at_once_on_ctrl_c(role: str) -> None:
    """Ctrl-C ends `role` (a role command run alone) at once, as SIGTERM does, in one line and exit
    code 130: a KeyboardInterrupt would print a traceback, or leave asyncio.run waiting for worker
    threads (one waiting up to inference.startup_timeout for unreachable inference.urls). What it was
    writing is atomic (run_folder.py): a kill leaves no partial adapter, checkpoint or batch."""

    def stop(signum: int, _frame: object) -> None:
        print(f"{role}: stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, stop)
