"""Pydantic models for every config section. Defaults here are the documented defaults.

An `rl` TOML has the sections of `RLConfig`; an `sft` TOML those of `SFTConfig`. Every model
forbids unknown keys, so a typo stops the program before anything starts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# vLLM's --max-lora-rank accepts only these values (docs/vllm.md).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(Section):
    rank: int = Field(8, ge=1, le=VLLM_LORA_RANKS[-1])
    alpha: float = 16.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    use_rslora: bool = False
    # Attention and MLP projections: attention-only LoRA underperforms in RL. As in PEFT: a list of
    # module names (or dotted suffixes such as "self_attn.q_proj"; names the model lacks are ignored),
    # a regex string that must match a whole module path, or "all-linear".
    target_modules: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # Modules left out of target_modules, in the same list-or-regex form.
    exclude_modules: list[str] | str = []
    # Modules trained in full and saved with the adapter (e.g. "lm_head"): `sft` only, since vLLM
    # serves LoRA weights alone (see check_for_rl).
    modules_to_save: list[str] = []
    # Start from an existing PEFT adapter (e.g. the output of `sft`).
    init_adapter: Path | None = None

    @field_validator("target_modules", "exclude_modules", mode="after")
    @classmethod
    def _names_or_regex(cls, value: list[str] | str) -> list[str] | str:
        # The command line hands every value of a list-or-string key over as a list, so a one-item list
        # that cannot be a module name is the regex (or "all-linear") the user wrote.
        if isinstance(value, list) and len(value) == 1 and not cls._is_module_name(value[0]):
            value = value[0]
        if isinstance(value, str):
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"{value!r} is not a valid regular expression: {e}") from None
            return value
        if bad := [v for v in value if not cls._is_module_name(v)]:
            # PEFT compares list items with module names literally, so these could never match.
            raise ValueError(f"list items are module names such as 'q_proj', not patterns: {bad}; "
                             "give a single string for a regular expression")  # fmt: skip
        return value

    @staticmethod
    def _is_module_name(name: str) -> bool:
        """A module name or dotted path ("q_proj", "self_attn.q_proj"), not a regular expression."""
        return all(part and all(c.isalnum() or c == "_" for c in part) for part in name.split("."))

    def check_for_rl(self) -> None:
        """What `rl` needs beyond `check_init_adapter`: vLLM loads LoRA weights only, so an adapter
        with fully trained modules (modules_to_save) could never be sampled from."""
        self.check_init_adapter()
        saved = self._saved_config().get("modules_to_save") if self.init_adapter is not None else None
        for where, modules in (("[model.lora] modules_to_save", self.modules_to_save),
                               (f"model.lora.init_adapter {self.init_adapter}", saved)):  # fmt: skip
            if modules:
                raise ValueError(
                    f"{where} trains {modules} in full, but rl serves every adapter through vLLM, which "
                    "loads LoRA weights only: use modules_to_save with sft, and target_modules for rl"
                )

    def check_init_adapter(self) -> None:
        """An init adapter must match this section: vLLM is started for this rank, and the trainer
        would otherwise silently train another layout than the config says."""
        if self.init_adapter is None:
            return
        saved = self._saved_config()
        for key, want in (("r", self.rank), ("lora_alpha", self.alpha), ("use_rslora", self.use_rslora)):
            if saved.get(key) != want:
                raise ValueError(
                    f"model.lora.init_adapter {self.init_adapter} has {key}={saved.get(key)}, "
                    f"but [model.lora] says {want}: make them agree"
                )

    def _saved_config(self) -> dict[str, Any]:
        path = Path(str(self.init_adapter)) / "adapter_config.json"
        if not path.is_file():
            raise ValueError(f"model.lora.init_adapter: {path} not found (expected a PEFT adapter folder)")
        return dict(json.loads(path.read_text()))


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
    # Importance ratio pi_trainer / pi_vllm of each token ("token"), or of each sample ("sequence":
    # exp of the mean token log-ratio over its loss tokens, as GSPO). Tokens or samples whose ratio
    # leaves [1 - ratio_low, 1 + ratio_high] are PPO-clipped ("clip") or dropped from the loss ("mask").
    ratio_level: Literal["token", "sequence"] = "token"
    ratio_mode: Literal["clip", "mask"] = "clip"
    ratio_low: float = Field(0.2, ge=0)
    ratio_high: float = Field(0.28, ge=0)
    # Sum over loss tokens divided by: the step's loss tokens ("token"); each sample's loss tokens,
    # then the step's samples ("sequence", GRPO); or norm_constant ("constant", Dr. GRPO: e.g.
    # batch_size * max_tokens).
    norm: Literal["token", "sequence", "constant"] = "token"
    norm_constant: float | None = Field(None, gt=0)
    # Weight of the per-token KL penalty (k3 estimator) to the base model, i.e. the adapter disabled.
    kl_coef: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _constant_norm_has_its_constant(self) -> LossConfig:
        if self.norm == "constant" and self.norm_constant is None:
            raise ValueError('norm = "constant" needs norm_constant (e.g. batch_size * max_tokens)')
        return self


class CheckpointConfig(Section):
    interval: int | None = Field(
        None, ge=1, description="write checkpoints/step_N/trainer/ every N steps; unset: never"
    )
    keep_last: int | None = Field(None, ge=1, description="delete all but the newest N checkpoints; unset: keep all")


class ResumeConfig(Section):
    # `--resume` alone gives ResumeConfig() (the latest checkpoint); `--resume.step N` picks step N.
    step: int | None = Field(None, ge=1, description="the checkpoint to resume from; unset: the latest")


class ParallelConfig(Section):
    # Data-parallel ranks (torchrun; gloo on CPU, NCCL on GPU), each on its share of every batch.
    dp: int = Field(1, ge=1)
    fsdp: bool = Field(
        False,
        description="shard the model's weights (frozen base and adapter) over the dp ranks with FSDP2, one shard "
        "group per decoder layer; for models that don't fit one device",
    )

    @model_validator(mode="after")
    def _fsdp_shards_over_ranks(self) -> ParallelConfig:
        if self.fsdp and self.dp < 2:
            raise ValueError(f"fsdp = true shards the weights over the dp ranks, so it needs dp >= 2 (dp = {self.dp})")
        return self


class TrainerConfig(Section):
    optim: OptimConfig = OptimConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    loss: LossConfig = LossConfig()
    micro_batch_size: int = Field(
        16, ge=1, description="per forward/backward: samples, or with packing rows of up to seq_len tokens"
    )
    # Several samples per row, each attending only to itself: the same loss and gradients, less padding.
    packing: bool = Field(True, description="pack samples into rows of seq_len tokens, without cross-sample attention")
    # Seconds to wait for a rollout batch before giving up (the orchestrator may have died).
    batch_timeout: float = Field(1800.0, gt=0)
    # Recompute each layer's activations in the backward pass: far less activation memory, for one
    # more forward pass per micro-batch.
    gradient_checkpointing: bool = False
    # Torch CPU threads. Unset: torch's default, except that `rl` starting vLLM workers on a machine
    # without a GPU leaves one core per worker to vLLM (sharing a core with its worker is ~4x slower).
    num_threads: int | None = Field(None, ge=1)
    parallel: ParallelConfig = ParallelConfig()
    ckpt: CheckpointConfig = CheckpointConfig()


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


class EvalConfig(Section):
    interval: int = Field(10, ge=1, description="evaluate policy versions 0, interval, 2*interval, ... and the last")
    num_examples: int = Field(16, ge=1, description="held-out examples per environment")
    rollouts_per_example: int = Field(4, ge=1, description="k of avg@k and pass@k")
    seed: int = Field(10_000, description="draws the held-out examples (keep it apart from the training seed)")


class OrchestratorConfig(Section):
    batch_size: int = Field(64, ge=1, description="rollouts per trainer step")
    rollouts_per_example: int = Field(8, ge=1)
    # How many policy versions the batch for step s may lag: it is sampled with version >= s-1-N.
    max_async_level: int = Field(1, ge=0)
    # None: each batch holds exactly the groups drawn for its step (it waits for the slowest).
    # K: continuous batching: a batch takes the first groups to finish, so slow ones roll over into
    # later batches; a group that would lag more than K versions is dropped (and counted).
    max_off_policy_steps: int | None = Field(None, ge=0)
    sampling: SamplingConfig = SamplingConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    env: list[EnvConfig] = [EnvConfig()]
    seed: int = 0
    # Seconds to wait for the trainer's next adapter before giving up (the trainer may have died).
    policy_timeout: float = Field(1800.0, gt=0)
    num_samples_to_log: int = Field(4, ge=0, description="decoded rollouts per step in samples/")
    eval: EvalConfig | None = None
    # Delete broadcasts/step_N once no worker serves version N any more (the final one stays).
    delete_old_broadcasts: bool = True

    @model_validator(mode="after")
    def _groups_fill_batch(self) -> OrchestratorConfig:
        if self.batch_size % self.rollouts_per_example:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of rollouts_per_example "
                f"({self.rollouts_per_example})"
            )
        return self

    @model_validator(mode="after")
    def _off_policy_bound_holds_async_groups(self) -> OrchestratorConfig:
        if self.max_off_policy_steps is not None and self.max_off_policy_steps < self.max_async_level:
            raise ValueError(
                f"max_off_policy_steps ({self.max_off_policy_steps}) < max_async_level ({self.max_async_level}) "
                "would drop the groups sampled ahead on purpose as soon as they finish: lower max_async_level "
                "instead, or raise max_off_policy_steps"
            )
        return self

    @property
    def max_policy_lag(self) -> int:
        """How many versions older than the trainer's a rollout in a batch can be."""
        return self.max_async_level if self.max_off_policy_steps is None else self.max_off_policy_steps

    @property
    def adapter_slots(self) -> int:
        """Adapter versions a vLLM worker must hold at once: every version rollouts may still use
        (max_policy_lag + 1), plus the next one, loaded before the oldest is unloaded."""
        return self.max_policy_lag + 2


class InferenceConfig(Section):
    num_workers: int = Field(1, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(8000, description="worker i listens on port + i")
    # Use vLLM servers that are already running instead of starting them.
    urls: list[str] = []
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE (whole GiB) on machines without a GPU")
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
    resume: ResumeConfig | None = Field(None, description="continue from a checkpoint in this run folder")
    dry_run: bool = Field(False, exclude=True, description="write configs and commands, start nothing")

    @model_validator(mode="after")
    def _rl_trains_lora(self) -> RLConfig:
        if self.model.lora is None:
            self.model.lora = LoraConfig()
        return self

    @model_validator(mode="after")
    def _adapter_slots_fit(self) -> RLConfig:
        # A user's --max-loras must hold every adapter version a worker can have loaded at once.
        args = self.inference.extra_args
        slots = self.orchestrator.adapter_slots
        if "--max-loras" in args[:-1]:
            given = int(args[args.index("--max-loras") + 1])
            if given < slots:
                raise ValueError(
                    f"inference.extra_args sets --max-loras {given}, but rollouts may lag "
                    f"{self.orchestrator.max_policy_lag} versions (max_async_level / max_off_policy_steps), "
                    f"so {slots} adapter versions can be loaded: raise --max-loras or leave it out (rl derives it)"
                )
        return self

    @property
    def lora(self) -> LoraConfig:
        assert self.model.lora is not None  # set by the validator
        return self.model.lora


class SFTDataConfig(Section):
    path: Path = Field(
        description="JSONL or Parquet file, or a `datasets` folder; records {'messages': [{'role', 'content'}, ...]} "
        "or {'prompt', 'completion'} (strings or message lists)"
    )
    split: str = Field("train", description="the split to use from a `datasets` folder that has several")
    shuffle: bool = True
    loss_on: Literal["assistant", "all", "last_turn"] = Field(
        "assistant", description="tokens that carry loss: every assistant turn, every token, or the last assistant turn"
    )
    truncation: Literal["truncate", "skip"] = Field(
        "truncate", description="an example longer than seq_len is cut to seq_len, or left out (counted and logged)"
    )
    # Held-out eval data: a random fraction of `path` (drawn with the run's seed) or a file of its own.
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    eval_path: Path | None = None

    @model_validator(mode="after")
    def _one_eval_source(self) -> SFTDataConfig:
        if self.eval_fraction > 0 and self.eval_path is not None:
            raise ValueError("set data.eval_fraction or data.eval_path, not both")
        return self


class SFTEvalConfig(Section):
    interval: int = Field(100, ge=1, description="eval loss every N steps and after the last (with eval data)")


class SFTConfig(SharedConfig):
    model: ModelConfig
    data: SFTDataConfig
    optim: OptimConfig = OptimConfig(lr=1e-3)
    scheduler: SchedulerConfig = SchedulerConfig()
    batch_size: int = Field(32, ge=1, description="samples per optimizer step")
    micro_batch_size: int = Field(
        32, ge=1, description="per forward/backward: samples, or with packing rows of up to seq_len tokens"
    )
    packing: bool = Field(True, description="pack samples into rows of seq_len tokens, without cross-sample attention")
    log_interval: int = Field(10, ge=1)
    eval: SFTEvalConfig = SFTEvalConfig()
    parallel: ParallelConfig = ParallelConfig()
    ckpt: CheckpointConfig = CheckpointConfig()
    resume: ResumeConfig | None = Field(None, description="continue from a checkpoint in this run folder")
