"""What `rl` starts: the per-process configs and the exact commands, written to configs/."""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field

from lorarl.config.models import RLConfig
from lorarl.inference.server import vllm_command, vllm_env
from lorarl.run_folder import RunFolder

_SHARED = {"max_steps", "seq_len", "output_dir", "run_name", "seed", "monitor", "resume"}
# The sections each process reads; `trainer @ configs/trainer.json` reproduces that process alone.
_SECTIONS = {
    "trainer": {"model", "trainer"} | _SHARED,
    "orchestrator": {"model", "orchestrator", "inference", "trainer"} | _SHARED,  # trainer.ckpt: when to checkpoint
    "inference": {"model", "inference", "orchestrator"} | _SHARED,
}


@dataclass
class ProcessSpec:
    name: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the launcher's environment

    def shell(self) -> str:
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.cmd)])


def plan_run(cfg: RLConfig, run: RunFolder, has_gpu: bool) -> list[ProcessSpec]:
    """Write configs/{trainer,orchestrator,inference}.json and commands.txt; return the processes
    in start order (inference workers first: the others need them)."""
    run.configs.mkdir(parents=True, exist_ok=True)
    starts_cpu_workers = not has_gpu and not cfg.inference.urls
    if starts_cpu_workers and cfg.trainer.num_threads is None:
        cfg = cfg.model_copy(deep=True)
        free_cores = (os.cpu_count() or 1) - cfg.inference.num_workers
        cfg.trainer.num_threads = max(1, free_cores // cfg.trainer.parallel.dp)
    for role, sections in _SECTIONS.items():
        (run.configs / f"{role}.json").write_text(
            json.dumps(cfg.model_dump(mode="json", include=sections), indent=2) + "\n"
        )
    specs = []
    if not cfg.inference.urls:
        specs += [
            ProcessSpec(f"inference-{i}", vllm_command(cfg, i), vllm_env(cfg, i, has_gpu))
            for i in range(cfg.inference.num_workers)
        ]
    specs += [
        ProcessSpec(role, [*_launcher(cfg, role), "-m", f"lorarl.cli.{role}", "@", str(run.configs / f"{role}.json")])
        for role in ("orchestrator", "trainer")
    ]
    (run.configs / "commands.txt").write_text("".join(f"# {s.name}\n{s.shell()}\n" for s in specs))
    return specs


def torchrun(nproc: int) -> list[str]:
    """The interpreter prefix that runs a module as `nproc` data-parallel ranks on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def _launcher(cfg: RLConfig, role: str) -> list[str]:
    dp = cfg.trainer.parallel.dp
    return torchrun(dp) if role == "trainer" and dp > 1 else [sys.executable]
