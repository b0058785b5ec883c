"""Pydantic models for every config section. Defaults here are the documented defaults.

An `rl` TOML has the sections of `RLConfig`; an `sft` TOML those of `SFTConfig`. Every model
forbids unknown keys, so a typo stops the program before anything starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# vLLM's --max-lora-rank accepts only these values (VLLM_NOTES.md).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(Section):
    rank: int = Field(8, ge=1, le=VLLM_LORA_RANKS[-1])
    alpha: float = 16.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    use_rslora: bool = False
    # Attention and MLP projections: attention-only LoRA underperforms in RL.
    target_modules: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # Start from an existing PEFT adapter (e.g. the output of `sft`).
    init_adapter: Path | None = None

    def check_init_adapter(self) -> None:
        """An init adapter must match this section: vLLM is started for this rank, and the trainer
        would otherwise silently train another layout than the config says."""
        if self.init_adapter is None:
            return
        path = Path(self.init_adapter) / "adapter_config.json"
        if not path.is_file():
            raise ValueError(f"model.lora.init_adapter: {path} not found (expected a PEFT adapter folder)")
        saved = json.loads(path.read_text())
        for key, want in (("r", self.rank), ("lora_alpha", self.alpha), ("use_rslora", self.use_rslora)):
            if saved.get(key) != want:
                raise ValueError(
                    f"model.lora.init_adapter {self.init_adapter} has {key}={saved.get(key)}, "
                    f"but [model.lora] says {want}: make them agree"
                )


class ModelConfig(Section):
    name: str = Field(description="Hugging Face model folder (or hub id where a hub is reachable)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: str = "sdpa"
    # Absent in an `sft` config means full fine-tuning; `rl` always trains a LoRA adapter.
    lora: LoraConfig | None = None


class OptimConfig(Section):
    lr: float = Field(5e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    max_norm: float = Field(1.0, gt=0)


class SchedulerConfig(Section):
    type: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)


class LossConfig(Section):
    # Token-level importance ratio pi_trainer / pi_vllm. Tokens whose ratio leaves
    # [1 - ratio_low, 1 + ratio_high] are PPO-clipped ("clip") or dropped from the loss ("mask").
    ratio_mode: Literal["clip", "mask"] = "clip"
    ratio_low: float = Field(0.2, ge=0)
    ratio_high: float = Field(0.28, ge=0)


class TrainerConfig(Section):
    optim: OptimConfig = OptimConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    loss: LossConfig = LossConfig()
    micro_batch_size: int = Field(16, ge=1, description="samples per forward/backward pass")
    # Seconds to wait for a rollout batch before giving up (the orchestrator may have died).
    batch_timeout: float = Field(1800.0, gt=0)
    # Torch CPU threads. Unset: torch's default, except that `rl` starting vLLM workers on a machine
    # without a GPU leaves one core per worker to vLLM (sharing a core with its worker is ~4x slower).
    num_threads: int | None = Field(None, ge=1)


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(128, ge=1)


class AdvantageConfig(Section):
    # Group-normalized advantages: (r - mean(group)) / (std(group) + eps) when std_normalize.
    std_normalize: bool = True


class EnvConfig(Section):
    id: str = "reverse_text"
    weight: float = Field(1.0, gt=0)
    args: dict[str, Any] = {}


class OrchestratorConfig(Section):
    batch_size: int = Field(64, ge=1, description="rollouts per trainer step")
    rollouts_per_example: int = Field(8, ge=1)
    # How many policy versions the batch for step s may lag: it is sampled with version >= s-1-N.
    max_async_level: int = Field(1, ge=0)
    sampling: SamplingConfig = SamplingConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    env: list[EnvConfig] = [EnvConfig()]
    seed: int = 0
    # Seconds to wait for the trainer's next adapter before giving up (the trainer may have died).
    policy_timeout: float = Field(1800.0, gt=0)
    num_samples_to_log: int = Field(4, ge=0, description="decoded rollouts per step in samples/")

    @model_validator(mode="after")
    def _groups_fill_batch(self) -> OrchestratorConfig:
        if self.batch_size % self.rollouts_per_example:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of rollouts_per_example "
                f"({self.rollouts_per_example})"
            )
        return self


class InferenceConfig(Section):
    num_workers: int = Field(1, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(8000, description="worker i listens on port + i")
    # Use vLLM servers that are already running instead of starting them.
    urls: list[str] = []
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    kv_cache_gib: float = Field(1.0, gt=0, description="VLLM_CPU_KVCACHE_SPACE on machines without a GPU")
    startup_timeout: float = Field(600.0, gt=0)
    extra_args: list[str] = []


class WandbConfig(Section):
    project: str = "lorarl"
    mode: Literal["online", "offline", "disabled"] = "offline"


class MonitorConfig(Section):
    jsonl: bool = True
    console: bool = True
    wandb: WandbConfig | None = None


class SharedConfig(Section):
    """Top-level keys that every part of a run reads."""

    max_steps: int = Field(20, ge=1)
    seq_len: int = Field(512, ge=16, description="max prompt + completion tokens of one sample")
    output_dir: Path = Path("outputs")
    run_name: str = Field("default", pattern=r"^[A-Za-z0-9._-]+$")
    seed: int = 0
    monitor: MonitorConfig = MonitorConfig()

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name


class RLConfig(SharedConfig):
    model: ModelConfig
    trainer: TrainerConfig = TrainerConfig()
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    inference: InferenceConfig = InferenceConfig()
    dry_run: bool = Field(False, exclude=True, description="write configs and commands, start nothing")

    @model_validator(mode="after")
    def _rl_trains_lora(self) -> RLConfig:
        if self.model.lora is None:
            self.model.lora = LoraConfig()
        return self

    @property
    def lora(self) -> LoraConfig:
        assert self.model.lora is not None  # set by the validator
        return self.model.lora


class SFTDataConfig(Section):
    path: Path = Field(description="JSONL file, one chat per line: {'messages': [{'role', 'content'}, ...]}")
    shuffle: bool = True


class SFTConfig(SharedConfig):
    model: ModelConfig
    data: SFTDataConfig
    optim: OptimConfig = OptimConfig(lr=1e-3)
    scheduler: SchedulerConfig = SchedulerConfig()
    batch_size: int = Field(32, ge=1, description="samples per optimizer step")
    micro_batch_size: int = Field(32, ge=1)
    log_interval: int = Field(10, ge=1)
