"""`[inference]`: the vLLM servers, started by `rl` (`lorarl-inference` starts one alone) or already
running (urls), and how the orchestrator talks to them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from lorarl.addresses import is_loopback, url_problem
from lorarl.config.common import MIN_WAIT, Section

# vLLM flags `rl` sets from the config (inference/server.py's vllm_command): in extra_args vLLM would
# take the later one, and the run would disagree with its own config (another port, length, model).
_OWN_FLAGS = {
    "--model": "model.name",
    "--dtype": "model.dtype",
    "--max-model-len": "seq_len",
    "--host": "inference.host",
    "--port": "inference.port",
    "--seed": "seed",
    "--tensor-parallel-size": "inference.tensor_parallel_size",
    "--gpu-memory-utilization": "inference.memory_fraction",
    "--api-key": "inference.api_key",
    "--max-lora-rank": "model.lora.rank (the largest of the run's adapters)",
    "--logprobs-mode": "none: lorarl needs processed_logprobs (the sampled distribution's)",
    "--enable-lora": "model.full_finetune (LoRA is served unless it is true)",
    "--served-model-name": "model.name (the orchestrator asks for the model by that name)",
    "--tokenizer": "model.name (the tokenizer the trainer and orchestrator use too)",
    "--worker-extension-cls": "none: lorarl's loads adapters on the CPU and weights for full fine-tuning",
}


def vllm_flag(arg: str) -> str:
    """The flag of a vLLM argument as vLLM reads it: `--max_model_len=4096` is `--max-model-len` (vLLM's
    parser takes underscores for dashes), so that no spelling slips past the flags lorarl sets."""
    flag = arg.split("=", 1)[0]
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


class InferenceConfig(Section):
    num_workers: int = Field(1, ge=1)
    """vLLM servers `rl` starts, each serving the whole model (on GPUs, each on tensor_parallel_size GPUs
    of its own: gpu_ids); requests go to the worker with the fewest in flight. Unused with urls."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs each vLLM server splits the model over (vLLM's `--tensor-parallel-size`), for a model too
    large for one GPU or faster sampling of a large one; 1: one GPU per server."""
    gpu_ids: list[Annotated[int, Field(ge=0)]] | None = None
    """GPUs the vLLM servers share out, num_workers × tensor_parallel_size of them, as indices among the
    GPUs `rl` sees: worker i takes the i-th tensor_parallel_size of them. With urls: the GPUs of those
    servers, if on this machine, which the trainer then keeps clear of. None: the first free GPUs (those
    not in trainer.gpu_ids; with colocate_with_trainer, the first GPUs). Unused without GPUs."""
    colocate_with_trainer: bool = False
    """Let the trainer share GPUs with the vLLM servers (the only way to run on one GPU): vLLM then takes
    gpu_memory_utilization (default 0.4) of each shared GPU and the trainer what is left. False: a GPU
    given to both is refused."""
    host: str = "127.0.0.1"
    """Address the vLLM servers `rl` starts listen on and are reached at."""
    port: int = Field(8000, ge=1, le=65535)
    """Port of the first vLLM server `rl` starts; worker i listens on port + i."""
    urls: list[str] = []
    """Base URLs of vLLM servers that are already running (e.g. "http://127.0.0.1:8000"), used instead of
    starting any; several runs can share them. []: `rl` starts num_workers servers."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """Fraction of each of its GPUs' memory a vLLM server takes for weights, activations and KV cache
    (vLLM's `--gpu-memory-utilization`). With colocate_with_trainer, leave the trainer its peak
    (`memory/peak_gib`) plus about 2 GiB: see docs/gpus.md. None: 0.9, or 0.4 with colocate_with_trainer."""
    kv_cache_gib: int = Field(1, ge=1)
    """KV cache per vLLM server in whole GiB on machines without a GPU (VLLM_CPU_KVCACHE_SPACE)."""
    time_share: bool | None = None
    """Whether vLLM and the trainer take turns on hardware they share instead of running at once: the
    orchestrator samples a step's rollouts only once the trainer has published the policy of the step
    before (on-policy, as max_async_level 0, whatever max_async_level says), so the trainer steps while
    vLLM waits and vLLM generates while the trainer waits. On a machine without GPUs each side then runs
    on every core in its turn (cpu_threads, trainer.num_threads) instead of on its share of them, which
    pays when both sides speed up with more cores (docs/performance.md). None: true for vLLM workers
    that share their GPUs with the trainer (colocate_with_trainer); false otherwise, the two overlapping
    max_async_level apart (on a CPU, splitting its cores measured as fast or faster)."""
    cpu_threads: int | None = Field(None, ge=1)
    """On a machine without GPUs: cores (and OpenMP threads) of each vLLM server `rl` starts, per
    tensor-parallel rank. Worker i's whole process tree is pinned to the next cores in order and its
    threads bound there, so that vLLM's busy-waiting engine cannot take the trainer's cores
    (docs/performance.md); workers that need every core spread over all of them. None: with time_share,
    every core (split evenly between workers); without, 1 each, leaving the last core (and any others)
    to trainer.num_threads. Unused with urls and on GPUs."""
    startup_timeout: float = Field(600.0, ge=MIN_WAIT)
    """Seconds to wait for every vLLM server to answer /health before giving up."""
    extra_args: list[str] = []
    """More arguments for every vLLM server `rl` starts, appended to its command (e.g. ["--enforce-eager"]);
    a `--max-loras` here replaces the derived one and must hold max_policy_lag + 2 adapters (for each
    of the [[variants]], if any). []: none."""
    unavailable_timeout: float = Field(300.0, ge=MIN_WAIT)
    """Seconds the orchestrator keeps retrying while no worker answers (each failing worker is taken
    out of routing and put back once healthy, with the adapters in use); then the run stops."""
    request_timeout: float = Field(60.0, ge=MIN_WAIT)
    """Seconds a worker gets to answer any request (queueing, the prompt, an adapter load, the /health
    probe sent every 5 s) before it counts as stalled; a generation gets max_tokens / min_tokens_per_s
    seconds more. A stalled worker is taken out of routing while the others carry the run (logged, and
    counted in inference/stalls), its requests are sent again elsewhere, and it is put back once
    /health answers again."""
    min_tokens_per_s: float = Field(2.0, gt=0)
    """The slowest generation expected of a healthy worker, in tokens per second of one sequence: a
    completion request may take request_timeout + max_tokens / min_tokens_per_s seconds. Lower it for
    slow hardware, raise it to notice a frozen worker sooner."""
    served_check: Literal["stop", "warn", "off"] = "stop"
    """The served-adapter check (docs/served_check.md): once a policy version is loaded on a worker, the
    worker scores a small fixed probe through that version's adapter name, before any rollout of that
    version goes to it, and its logprobs must match the trainer's within served_check_tolerance. A worker
    that fails, after one reload, stops the run in one line naming the worker, the version and the gaps
    ("stop"), or is logged in that line and left out of that version's rollouts ("warn"). "off": no
    check. LoRA only: full fine-tuning's versions are not checked."""
    served_check_tolerance: float | None = Field(None, gt=0)
    """The largest |Δ logprob| of any probe token between a worker and the trainer that passes the
    served-adapter check. None: follows model.dtype, 1e-2 for float32 and 0.25 for bfloat16/float16."""

    worker_run_dirs: list[str] = []
    """The run folder as each worker's machine sees it (worker i: the i-th), where the orchestrator tells
    it to load adapters from (broadcasts/step_N under it): for servers that mount it at another path, and
    set by `rl` on a Ray cluster with cluster.shared_fs = false (each node's copy). []: its own path."""
    api_key: str | None = None
    """Key the vLLM servers `rl` starts require (vLLM's `--api-key`) and the orchestrator sends
    (`Authorization: Bearer`), also to servers given by urls. Required when host is not a loopback
    address, so that a server reachable from other machines never serves (or swaps) adapters for
    anyone. None (or an empty or blank string): no key."""
    max_restarts: int = Field(3, ge=0)
    """How many times `rl` restarts a worker it started that died (the orchestrator routes around it
    meanwhile); one more death stops the run. Workers given by `urls` are never restarted."""

    @field_validator("extra_args", mode="after")
    @classmethod
    def _no_flag_of_lorarls(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = vllm_flag(arg)
            if flag in _OWN_FLAGS:
                raise ValueError(f"{flag} is set by lorarl from {_OWN_FLAGS[flag]}: set that key instead")
        return value

    @field_validator("urls", mode="after")
    @classmethod
    def _urls_are_server_addresses(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if problem := url_problem(url):
                raise ValueError(f"{url!r} {problem}: give a base URL such as 'http://127.0.0.1:8000'")
        return urls

    @field_validator("api_key", mode="after")
    @classmethod
    def _blank_key_is_no_key(cls, key: str | None) -> str | None:
        # vLLM checks no key when given an empty one: `--inference.api_key=` must not pass for a key.
        if key is None or not key.strip():
            return None
        if key != key.strip() or not key.isprintable():
            raise ValueError("has spaces at its ends or unprintable characters, which an HTTP header cannot carry")
        return key

    @model_validator(mode="after")
    def _open_servers_need_a_key(self) -> InferenceConfig:
        if self.api_key is None and not is_loopback(self.host):
            raise ValueError(
                f"inference.api_key is required when inference.host ({self.host}) is not a loopback address "
                "(an empty or blank key counts as none)"
            )
        return self

    @model_validator(mode="after")
    def _tolerance_of_a_check(self) -> InferenceConfig:
        # With the check off, a tolerance is read by nothing: the user believes adapters are checked.
        if self.served_check == "off" and self.served_check_tolerance is not None:
            raise ValueError(
                f'served_check_tolerance = {self.served_check_tolerance} does nothing with served_check = "off": '
                'set served_check = "stop" or "warn", or leave served_check_tolerance out'
            )
        return self

    @model_validator(mode="after")
    def _every_worker_has_a_port(self) -> InferenceConfig:
        if (last := self.port + self.num_workers - 1) > 65535:
            raise ValueError(f"port = {self.port}: worker {self.num_workers - 1} would listen on {last}, above 65535")
        return self

    @model_validator(mode="after")
    def _a_run_dir_per_worker(self) -> InferenceConfig:
        workers = len(self.urls) or self.num_workers
        if self.worker_run_dirs and len(self.worker_run_dirs) != workers:
            raise ValueError(
                f"worker_run_dirs lists {len(self.worker_run_dirs)} folders for {workers} workers: "
                "one per worker, or none"
            )
        return self

    @property
    def memory_fraction(self) -> float:
        """gpu_memory_utilization, or its default: less of each GPU when the trainer shares it."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return 0.4 if self.colocate_with_trainer else 0.9
