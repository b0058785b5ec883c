"""How lorarl starts vLLM's OpenAI server: the command, its environment, the worker URLs.

The same function serves `rl` (which starts the workers) and `lorarl-inference` (one worker alone).
The launcher decides what depends on the machine and the model (how many GPUs, whether an adapter
puts LoRA on MoE experts) and passes it in: inference never imports the launcher.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from lorarl.config.common import VLLM_LORA_RANKS
from lorarl.config.inference import vllm_flag
from lorarl.config.run import RLConfig
from lorarl.config.serve import ServeConfig, WorkersConfig
from lorarl.cpu.cores import pinned, worker_cores
from lorarl.cpu.host_memory import malloc_tunables
from lorarl.variants import variant_configs

# The run folder's copy of a quantized base (quantized_base.py, which imports torch: not here).
SERVED_BASE = "served_base"

# vLLM worker extensions, imported by the worker processes only (they import vLLM): full fine-tuning's,
# and LoRA ops on a CPU whose cost does not follow --max-lora-rank (cpu/lora_ops.py).
WEIGHT_RELOAD_EXTENSION = "lorarl.inference.weight_reload.WeightReload"
CPU_LORA_EXTENSION = "lorarl.cpu.lora_ops.CpuLoRA"


@dataclass(frozen=True)
class Adapters:
    """The LoRA adapters a run's workers serve: ranks up to `max_rank` (vLLM's --max-lora-rank, one
    of the values it accepts), `slots` of them at once (--max-loras), with LoRA on MoE experts or not."""

    max_rank: int
    slots: int
    experts: bool = False


def rl_adapters(cfg: RLConfig, experts: bool) -> Adapters | None:
    """What `rl @ cfg` serves: its adapter's (or sweep's) versions; None with full fine-tuning."""
    if cfg.model.full_finetune:
        return None
    return Adapters(served_lora_rank(cfg, experts), max_loras(cfg), experts)


def serve_adapters(cfg: ServeConfig) -> Adapters:
    """What `lorarl-serve` serves: its tenants' adapters, serve.max_loras at once, swapped beyond."""
    given = given_max_loras(cfg.inference.extra_args)
    return Adapters(vllm_max_lora_rank(cfg.serve.max_rank), cfg.serve.max_loras if given is None else given)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM's --max-lora-rank accepts that holds `rank`."""
    return next(r for r in VLLM_LORA_RANKS if r >= rank)


def served_lora_rank(cfg: RLConfig, experts: bool) -> int:
    """vLLM's --max-lora-rank for the run: room for the largest adapter's rank, twice that with expert
    LoRA (`experts`: PEFT gives the fused gate_up_proj rank 2r, and vLLM refuses an adapter whose
    rank_pattern exceeds --max-lora-rank)."""
    ranks = [c.lora.rank for _, c in variant_configs(cfg)] if cfg.variants else [cfg.lora.rank]
    return vllm_max_lora_rank(max(ranks) * (2 if experts else 1))


def adapter_slots(cfg: RLConfig) -> int:
    """Adapter versions a worker must hold at once (vLLM's --max-loras): for each variant's adapter, or
    the one adapter, every version rollouts may still use (max_policy_lag + 1), plus the next one,
    loaded before the oldest is unloaded."""
    return (cfg.orchestrator.max_policy_lag + 2) * max(1, len(cfg.variants))


def given_max_loras(extra_args: list[str]) -> int | None:
    """The `--max-loras` set in inference.extra_args (`--max-loras N` or `--max-loras=N`), if any;
    ValueError naming the key if it is no whole number."""
    for i, arg in enumerate(extra_args):
        if vllm_flag(arg) != "--max-loras":  # --max_loras too: vLLM reads it alike
            continue
        value = arg.partition("=")[2] if "=" in arg else extra_args[i + 1] if i + 1 < len(extra_args) else ""
        if not value.isdigit():
            raise ValueError(f"inference.extra_args: --max-loras takes a whole number, not {value!r}")
        return int(value)
    return None


def max_loras(cfg: RLConfig) -> int:
    """The adapters each worker holds: the user's --max-loras, or the run's adapter slots."""
    given = given_max_loras(cfg.inference.extra_args)
    return adapter_slots(cfg) if given is None else given


def worker_urls(cfg: WorkersConfig, hosts: list[str] | None = None) -> list[str]:
    """The URL of every worker: inference.urls, or those `rl` starts at inference.host, or at `hosts`
    (worker i's node address, where Ray placed them)."""
    inf = cfg.inference
    if inf.urls:
        return list(inf.urls)
    return [f"http://{hosts[i] if hosts else inf.host}:{inf.port + i}" for i in range(inf.num_workers)]


def vllm_command(
    cfg: WorkersConfig, adapters: Adapters | None, worker: int = 0, host: str | None = None, *, gpus: int
) -> list[str]:
    """The command of worker `worker`, serving `adapters` (None: full fine-tuning's whole weights),
    listening on `host` (its node's address where Ray placed it) or inference.host; on a machine without
    GPUs (`gpus` == 0) confined to its cores (cpu/cores.py)."""
    inf = cfg.inference
    reload = ["--worker-extension-cls", WEIGHT_RELOAD_EXTENSION]  # full fine-tuning: weights, no adapters
    serving = reload if adapters is None else lora_args(adapters, gpus, given_max_loras(inf.extra_args) is None)
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *model_args(cfg),
        "--dtype",
        cfg.model.dtype,
        "--max-model-len",
        str(cfg.seq_len),
        "--host",
        host or inf.host,
        "--port",
        str(inf.port + worker),
        "--seed",
        str(cfg.seed),
        *serving,
        # Logprobs of the distribution actually sampled from (temperature applied), which is what
        # the trainer computes; vLLM's default is the raw model distribution.
        "--logprobs-mode",
        "processed_logprobs",
        "--tensor-parallel-size",
        str(inf.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(inf.memory_fraction),
        *(["--api-key", inf.api_key] if inf.api_key else []),
        *inf.extra_args,
    ]
    return pinned(cmd, worker_cores(cfg, worker)) if gpus == 0 else cmd


def model_args(cfg: WorkersConfig) -> list[str]:
    """The model vLLM loads: model.name, or with model.quantization the base as the trainer sees it
    (the run folder's served_base/, quantized_base.py), served under model.name with its tokenizer."""
    if cfg.model.quantization == "none":
        return ["--model", cfg.model.name]
    served = str(cfg.run_dir / SERVED_BASE)
    return ["--model", served, "--served-model-name", cfg.model.name, "--tokenizer", cfg.model.name]


def lora_args(adapters: Adapters, gpus: int, with_slots: bool = True) -> list[str]:
    """Serving `adapters`: room for the largest rank and all their slots (`with_slots`: unless the user's
    inference.extra_args set --max-loras); on a CPU, with LoRA ops whose cost does not grow with that rank;
    with expert LoRA, the flag that loads PEFT's fused expert layout (docs/moe.md)."""
    slots = ["--max-loras", str(adapters.slots)] if with_slots else []
    cpu_ops = ["--worker-extension-cls", CPU_LORA_EXTENSION] if gpus == 0 else []
    fused = ["--enable-mixed-moe-lora-format"] if adapters.experts else []
    return ["--enable-lora", "--max-lora-rank", str(adapters.max_rank), *slots, *cpu_ops, *fused]


def vllm_env(cfg: WorkersConfig, gpus: str | None = None, on_gpu: bool = False) -> dict[str, str]:
    """The environment of one worker: `gpus` is its CUDA_VISIBLE_DEVICES (launcher/placement.py); None
    leaves the devices as they are, on GPUs Ray gave it (`on_gpu`) or on a CPU (then its KV cache and
    malloc's policy, cpu/host_memory.py). Full
    fine-tuning reloads weights through /collective_rpc and /reset_prefix_cache, endpoints that vLLM
    serves in its dev mode only."""
    full = cfg.model.full_finetune
    env = {"VLLM_SERVER_DEV_MODE": "1"} if full else {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    elif not on_gpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.inference.kv_cache_gib)
        env |= malloc_tunables(cfg.keep_freed_memory)  # vLLM starts its engine's processes: they inherit it
    return env
