"""`lorarl-inference @ cfg.toml [--worker i]`: one vLLM server exactly as `rl` starts it, on the GPUs `rl`
would give worker i."""

from __future__ import annotations

import os
import shlex
import sys
from typing import NoReturn

from lorarl.cli.common import ctrl_c_in_one_line, load_run_or_exit
from lorarl.config.run import RLConfig, RunMode
from lorarl.exit_codes import BAD_INPUT
from lorarl.inference.server import vllm_env
from lorarl.launcher.memory_plan import AdapterError
from lorarl.launcher.placement import PlacementError, visible_gpus, worker_gpus
from lorarl.launcher.plan import worker_command
from lorarl.launcher.preflight import PreflightError, check_model, check_seq_len


def refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(BAD_INPUT)


def take_worker(args: list[str]) -> int:
    """Remove `--worker i` (or `--worker=i`) from `args`; returns i, 0 without it."""
    found = [i for i, a in enumerate(args) if a == "--worker" or a.startswith("--worker=")]
    if not found:
        return 0
    if len(found) > 1:
        refuse("--worker: given more than once")
    i = found[0]
    if "=" in args[i]:
        value = args.pop(i).partition("=")[2]
    elif i + 1 < len(args):
        value = args.pop(i + 1)
        del args[i]
    else:
        refuse("--worker: expected a worker number (0 for the first of inference.num_workers)")
    if not (value.isascii() and value.isdigit()):
        refuse(f"--worker {value}: expected a worker number (0 for the first of inference.num_workers)")
    return int(value)


@ctrl_c_in_one_line("lorarl-inference")
def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    worker = take_worker(args)  # which of inference.num_workers to be: its port is inference.port + worker
    cfg, mode = load_run_or_exit(RLConfig, RunMode, args)
    if worker >= cfg.inference.num_workers:
        refuse(
            f"--worker {worker}: inference.num_workers = {cfg.inference.num_workers} has workers "
            f"0-{cfg.inference.num_workers - 1}"
        )
    try:
        # What `rl` checks of the model before it starts vLLM: else vLLM's own traceback, after its start.
        check_model(cfg.model.name)
        check_seq_len(cfg.model.name, cfg.seq_len)
        gpus = worker_gpus(cfg, mode, worker)
        cmd, env = worker_command(cfg, visible_gpus(mode), worker), vllm_env(cfg, gpus)
    except (PlacementError, PreflightError, AdapterError) as e:
        refuse(str(e))
    print(" ".join([*(f"{k}={v}" for k, v in env.items()), shlex.join(cmd)]), flush=True)
    if not mode.dry_run:
        os.execvpe(cmd[0], cmd, {**os.environ, **env})


if __name__ == "__main__":
    main()
