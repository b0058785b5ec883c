"""What `rl` starts: the per-process configs and the exact commands, written to configs/."""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from lorarl.config.run import RLConfig
from lorarl.cpu.cores import available_cores, trainer_threads
from lorarl.inference.server import rl_adapters, vllm_command, vllm_env, worker_urls
from lorarl.launcher.memory_plan import serves_expert_lora
from lorarl.launcher.placement import Placement, cuda_visible_devices
from lorarl.run_folder import RunFolder
from lorarl.written_files import record_written

Role = Literal["inference", "orchestrator", "trainer"]
_SHARED = {"max_steps", "seq_len", "output_dir", "run_name", "seed", "monitor", "resume", "variants",
           "keep_freed_memory"}  # fmt: skip
# The sections each process reads; `lorarl-trainer @ configs/trainer.json` reproduces that process alone.
_SECTIONS = {
    "trainer": {"model", "trainer"} | _SHARED,
    "orchestrator": {"model", "orchestrator", "inference", "trainer"} | _SHARED,  # trainer.ckpt: when to checkpoint
    "inference": {"model", "inference", "orchestrator"} | _SHARED,
}
# And parts of sections: the trainer scores tokens over what vLLM sampled from (top_p, top_k: loss.Nucleus),
# and keeps the adapters of the versions rollouts may come from (max_async_level: trainer/policy_gap.py).
_PARTS: dict[str, dict[str, Any]] = {"trainer": {"orchestrator": {"sampling": True, "max_async_level": True}}}


@dataclass
class ProcessSpec:
    name: str  # its log's name: inference-0, trainer, ...
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the launcher's environment
    role: Role = field(kw_only=True)  # what the launcher does when it exits (a worker restarts alone)

    def shell(self) -> str:
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.cmd)])


def worker_command(cfg: RLConfig, gpus: int, worker: int = 0, host: str | None = None) -> list[str]:
    """vLLM worker `worker`'s command on a machine with `gpus` GPUs (or a dry run's dry_run_devices)."""
    return vllm_command(cfg, rl_adapters(cfg, serves_expert_lora(cfg)), worker, host, gpus=gpus)


def plan_run(cfg: RLConfig, run: RunFolder, placement: Placement) -> list[ProcessSpec]:
    """Write configs/{trainer,orchestrator,inference}.json, commands.txt and placement.txt; return the
    processes in start order (inference workers first: the others need them). Each child gets the GPUs
    `placement` gives it through CUDA_VISIBLE_DEVICES."""
    run.configs.mkdir(parents=True, exist_ok=True)
    cfg = cfg.model_copy(deep=True)  # resolved values go to the per-process configs, not the user's object
    cfg.inference.time_share = placement.time_share
    if placement.on_gpu:
        # The GPUs as placed, so that `lorarl-inference @ configs/inference.json --worker i` picks the same.
        if not cfg.inference.urls:
            cfg.inference.gpu_ids = [g for s in placement.slots if s.name.startswith("inference-") for g in s.gpus]
        cfg.trainer.gpu_ids = list(placement["trainer"].gpus)
    elif not cfg.inference.urls and cfg.trainer.num_threads is None and not placement.ray:
        cfg.trainer.num_threads = trainer_threads(cfg, len(available_cores()))
    hosts = placement.worker_hosts()
    # Workers that Ray placed are reached at their nodes' addresses: the orchestrator gets those URLs.
    placed = {"inference": cfg.inference.model_copy(update={"urls": worker_urls(cfg, hosts)})} if hosts else {}
    for role, sections in _SECTIONS.items():
        role_cfg = cfg.model_copy(update=placed) if role == "orchestrator" else cfg
        include = dict.fromkeys(sections, True) | _PARTS.get(role, {})
        (run.configs / f"{role}.json").write_text(
            json.dumps(role_cfg.model_dump(mode="json", include=include), indent=2) + "\n"
        )
    # A dry run's pretended GPUs are not this machine's: its CUDA_VISIBLE_DEVICES does not map them.
    parent = None if placement.pretended else os.environ.get("CUDA_VISIBLE_DEVICES")

    def gpus(name: str) -> str | None:
        return cuda_visible_devices(placement[name].gpus, parent) if placement.on_gpu else None

    specs = [
        ProcessSpec(
            f"inference-{i}",
            worker_command(cfg, placement.device_gpus, i, hosts[i] if hosts else None),
            vllm_env(cfg, gpus(f"inference-{i}"), on_gpu=placement.device_gpus > 0),
            role="inference",
        )
        for i in range(0 if cfg.inference.urls else cfg.inference.num_workers)
    ]
    roles: tuple[Role, Role] = ("orchestrator", "trainer")
    for role in roles:
        cmd = [*_launcher(cfg, role, placement.ray), "-m", f"lorarl.cli.{role}", "@", str(run.configs / f"{role}.json")]
        # The trainer's ranks see their GPUs as cuda:0..dp-1 and each takes cuda:LOCAL_RANK.
        env = {"CUDA_VISIBLE_DEVICES": devices} if role == "trainer" and (devices := gpus(role)) else {}
        specs.append(ProcessSpec(role, cmd, env, role=role))
    (run.configs / "commands.txt").write_text("".join(f"# {s.name}\n{s.shell()}\n" for s in specs))
    (run.configs / "placement.txt").write_text(placement.table())
    names = [*(f"{role}.json" for role in _SECTIONS), "commands.txt", "placement.txt"]
    record_written(*(run.configs / name for name in names))
    return specs


def torchrun(nproc: int) -> list[str]:
    """The interpreter prefix that runs a module as `nproc` data-parallel ranks on this machine."""
    return [sys.executable, "-m", "lorarl.launcher.torchrun", "--standalone", f"--nproc-per-node={nproc}"]


def _launcher(cfg: RLConfig, role: str, ray: bool) -> list[str]:
    # On Ray each trainer rank is a process of its own, in its own bundle (ray_cluster.py), not torchrun's.
    dp = cfg.trainer.parallel.dp
    return torchrun(dp) if role == "trainer" and dp > 1 and not ray else [sys.executable]
