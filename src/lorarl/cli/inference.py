"""`inference @ cfg.toml [--worker i]`: one vLLM server exactly as `rl` starts it, on the GPUs `rl`
would give worker i."""

from __future__ import annotations

import os
import shlex
import sys

from lorarl.cli.common import load_or_exit
from lorarl.config.models import RLConfig
from lorarl.inference.server import vllm_command, vllm_env
from lorarl.launcher.placement import PlacementError, worker_gpus


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    worker = 0
    if "--worker" in args:  # which of inference.num_workers to be: its port is inference.port + worker
        i = args.index("--worker")
        worker = int(args[i + 1])
        del args[i : i + 2]
    cfg = load_or_exit(RLConfig, args)
    try:
        gpus = worker_gpus(cfg, worker)
    except PlacementError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    cmd, env = vllm_command(cfg, worker), vllm_env(cfg, gpus)
    print(" ".join([*(f"{k}={v}" for k, v in env.items()), shlex.join(cmd)]), flush=True)
    if not cfg.dry_run:
        os.execvpe(cmd[0], cmd, {**os.environ, **env})


if __name__ == "__main__":
    main()
