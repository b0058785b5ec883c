"""What the benchmarks share, written once, so that each of them holds only what it measures.

Every benchmark is a file run as a script (`python benchmarks/NAME.py`), so its folder is on sys.path and
it imports this module as `runner`. Here:

* ENV, the environment of every process a benchmark starts, and `cli`, the command of a lorarl CLI;
* a process group started and stopped (`process_group`, `stop`), a vLLM server waited on until it is
  healthy (`vllm_server`, `inference_server`), and `rl` run against it (`rl_against`);
* one case run in a process of its own, for its own threads, peak memory and allocator (`json_from_child`);
* a run's metrics rows, read only through `lorarl.monitor.plots.read_metrics` (the one reader of
  metrics.jsonl: no benchmark parses the file itself), their steady state (the steps after the first),
  and an `rl` run's summary (`rl_summary`);
* a free port and Markdown table rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from lorarl.inference.health import wait_until_healthy

# No download from the hub, no wandb, Ray without token authentication and no tokenizer thread pool
# beside the trainer's threads: what the tests (tests/conftest.py) and scripts/test.sh set too.
ENV: dict[str, str] = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "RAY_AUTH_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}
Row = dict[str, Any]
T = TypeVar("T")


def cli(name: str, *args: str) -> list[str]:
    """The command of lorarl's `name` CLI (rl, sft, trainer, inference, serve) with `args`, run by this
    interpreter: the lorarl the benchmark itself imports."""
    return [sys.executable, "-m", f"lorarl.cli.{name}", *args]


def stop(process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Stop `process` and every process of its group (a vLLM server's engine and workers): SIGTERM, then
    SIGKILL if it has not exited after `timeout` seconds (vLLM may wait on requests a failed benchmark
    left in flight)."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def process_group(
    cmd: Sequence[str], log: Path | None = None, env: dict[str, str] = ENV, stop_timeout: float = 60.0
) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` started in a process group of its own, its output to `log` (or dropped), and stopped (`stop`)
    on the way out, whatever happens inside."""
    with open(log or os.devnull, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield process
    finally:
        stop(process, stop_timeout)


@contextlib.contextmanager
def vllm_server(
    cmd: Sequence[str], urls: Sequence[str], log: Path | None = None, env: dict[str, str] = ENV, timeout: float = 600.0
) -> Iterator[subprocess.Popen[bytes]]:
    """The vLLM server `cmd`, waited on until each of its `urls` answers GET /health (at most `timeout`
    seconds; an error as soon as it exits), stopped on the way out. Yields its process."""
    with process_group(cmd, log, env) as process:
        wait_until_healthy(urls, timeout, alive=lambda: process.poll() is None)
        yield process


@contextlib.contextmanager
def inference_server(
    config: Sequence[str], port: int, flags: Sequence[str] = (), log: Path | None = None, timeout: float = 600.0
) -> Iterator[str]:
    """`lorarl-inference` of an rl config (`@ file.toml ...`, then `flags`) on `port`: the server `rl`
    would start for it, shared by the benchmark's runs. Yields its url."""
    url = f"http://127.0.0.1:{port}"
    with vllm_server(cli("inference", *config, "--inference.port", str(port), *flags), [url], log, timeout=timeout):
        yield url


def rl_against(url: str, config: Sequence[str], run_name: str, steps: int, flags: Sequence[str] = ()) -> None:
    """`rl` of `config` (`@ file.toml ...`, then `flags`) for `steps` steps as `run_name`, its rollouts
    from the running server at `url`; an earlier run of that name (the benchmark's own) is overwritten.
    The trainer takes every core but one: `rl` leaves vLLM its core only when it starts the workers."""
    threads = max(1, (os.cpu_count() or 1) - 1)
    cmd = cli(
        "rl", *config, "--inference.urls", json.dumps([url]), "--max_steps", str(steps), "--run_name", run_name,
        "--trainer.num_threads", str(threads), "--no-monitor.console", "--overwrite", *flags,
    )  # fmt: skip
    subprocess.run(cmd, check=True, env=ENV)


def json_from_child(
    argv: Sequence[str],
    env: dict[str, str] = ENV,
    while_running: Callable[[subprocess.Popen[bytes]], object] | None = None,
) -> dict[str, Any]:
    """`python *argv` (a benchmark file and the flags of one case) in a process of its own, for its own
    threads, peak memory and allocator: the JSON object its last line of output prints. `while_running`
    gets the process once started (to watch its memory, say). Its output goes to a file, not a pipe, so
    that however much it prints it never blocks; its stderr is this process's. RuntimeError if it fails."""
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen([sys.executable, *argv], stdout=out, env=env)
        try:
            if while_running is not None:
                while_running(process)
        finally:
            process.wait()
        out.seek(0)
        lines = out.read().decode().strip().splitlines()
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {process.returncode})")
    return dict(json.loads(lines[-1]))


def metrics_rows(run_dir: Path, component: str | None = None) -> list[Row]:
    """The run's metrics rows, those of `component` alone if given, in step order (the rows of one step,
    one per variant, as written); read by `read_metrics`, the one reader of metrics.jsonl."""
    # Imported here: its module's matplotlib would add ~35 MB to the peak memory of every child process
    # that imports this module to measure it (qlora.py, lora_vs_full.py).
    from lorarl.monitor.plots import read_metrics

    rows = (r for r in read_metrics(run_dir) if component is None or r["component"] == component)
    return sorted(rows, key=lambda r: r["step"])


def after_warmup(items: Sequence[T], warmup: int = 1) -> list[T]:
    """The steady state of a series: its items after the first `warmup` (the steps that load, compile and
    warm up), or all of them when there are no more."""
    return list(items[warmup:]) or list(items)


def steady_rows(rows: Sequence[Row], warmup: int = 1) -> list[Row]:
    """The rows of the steps after the first `warmup` steps among `rows` (all of them when there are no
    more), every row of a step kept: a run of several variants writes one per variant."""
    kept = set(after_warmup(sorted({r["step"] for r in rows}), warmup))
    return [r for r in rows if r["step"] in kept]


def rl_summary(run_dir: Path, warmup: int = 1) -> dict[str, float]:
    """An `rl` run's steady state, its steps after the first `warmup`: steps per minute, the trainer's idle
    fraction (waiting for a batch / wall time), the inference fleet's busy fraction (time with requests
    in flight / wall time, averaged over workers), the mean policy lag, the mean reward of the last 5
    steps and the groups dropped."""
    trainer = steady_rows(metrics_rows(run_dir, "trainer"), warmup)
    orchestrator = steady_rows(metrics_rows(run_dir, "orchestrator"), warmup)
    wall = trainer[-1]["time"] - trainer[0]["time"] + trainer[0]["time/step"]
    return {
        "steps_per_min": 60 * len(trainer) / wall,
        "trainer_idle_frac": sum(r["time/wait_for_batch"] for r in trainer) / wall,
        "inference_busy_frac": statistics.fmean(r["inference/busy_frac"] for r in orchestrator),
        "policy_lag_mean": statistics.fmean(r["policy_lag/mean"] for r in trainer),
        "reward_last": statistics.fmean(r["reward/mean"] for r in orchestrator[-5:]),
        "dropped_groups": sum(r["dropped/groups"] for r in orchestrator),
    }


def free_port() -> int:
    """A TCP port free on every interface now (the system's pick), for a server the benchmark starts."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def markdown_row(cells: Iterable[object]) -> str:
    """One row of a Markdown table."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def markdown_head(names: Sequence[str]) -> str:
    """A Markdown table's first two lines: its column names, then the separator row."""
    return markdown_row(names) + "\n|" + "---|" * len(names)
