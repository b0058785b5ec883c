"""`sft`'s config: supervised fine-tuning of a LoRA adapter, or of all weights, on chat data."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from lorarl.config.common import DEFAULT_LOGITS_CHUNK_SIZE, LOGITS_CHUNK_DOC, Section, UserPath
from lorarl.config.model import ModelConfig, check_quantized_base
from lorarl.config.run import ResumeConfig, SharedConfig
from lorarl.config.trainer import CheckpointConfig, OptimConfig, ParallelConfig, SchedulerConfig


class SFTDataConfig(Section):
    path: UserPath
    """The training data: a .jsonl or .parquet file, or a folder (save_to_disk's, or of .jsonl and .parquet
    files). Records are chats, {"messages": [{"role", "content"}, ...]}, or {"prompt", "completion"} whose
    parts are strings (a user and an assistant message) or message lists."""
    split: str = "train"
    """The split to use from a `datasets` folder that has several (for path and eval_path)."""
    shuffle: bool = True
    """Draw the samples of each epoch in a fresh seeded order; false: in file order."""
    loss_on: Literal["assistant", "all", "last_turn"] = "assistant"
    """Tokens that carry loss: "assistant": every assistant turn; "all": every token; "last_turn": the last
    assistant turn. An example left without loss tokens is left out (counted and logged)."""
    truncation: Literal["truncate", "skip"] = "truncate"
    """An example longer than seq_len is cut to seq_len ("truncate") or left out ("skip", counted and logged)."""
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    """Fraction of path's records held out at random (drawn with the run's seed) for the eval loss; 0: none."""
    eval_path: UserPath | None = None
    """Held-out eval data in a file or folder of its own, in the format of path; None: none (or eval_fraction)."""

    @model_validator(mode="after")
    def _one_eval_source(self) -> SFTDataConfig:
        if self.eval_fraction > 0 and self.eval_path is not None:
            raise ValueError("set data.eval_fraction or data.eval_path, not both")
        return self


class SFTEvalConfig(Section):
    interval: int = Field(100, ge=1)
    """Compute the eval loss (eval/loss) every N steps and after the last; only with eval data
    (data.eval_fraction or data.eval_path)."""


class SFTConfig(SharedConfig):
    """`sft`: supervised fine-tuning of a LoRA adapter, or of all weights, on chat data. The result is
    written to `<output_dir>/<run_name>/final/`: a PEFT adapter, or a full model folder that [model] name
    can point to."""

    model: ModelConfig
    """The model to fine-tune, and the LoRA adapter if any."""
    data: SFTDataConfig
    """The training data and how it is turned into samples."""
    optim: OptimConfig = OptimConfig(lr=1e-3)
    """The optimizer, AdamW."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """The learning-rate schedule."""
    batch_size: int = Field(32, ge=1)
    """Samples per optimizer step, drawn epoch after epoch."""
    micro_batch_size: int = Field(32, ge=1)
    """Samples per forward/backward pass, or with packing rows of up to seq_len tokens (the same bound on
    tokens per pass); gradients accumulate over a step's passes."""
    packing: bool = True
    """Put several samples into each row, each with position ids from 0 and attention only within itself:
    the same loss and gradients up to float rounding, with less padding. False: one sample per padded row."""
    logits_chunk_size: int = Field(DEFAULT_LOGITS_CHUNK_SIZE, ge=0, description=LOGITS_CHUNK_DOC)
    log_interval: int = Field(10, ge=1)
    """Log loss, grad_norm, lr and throughput to the metrics every N steps and after the last."""
    eval: SFTEvalConfig = SFTEvalConfig()
    """When to compute the loss on held-out data."""
    parallel: ParallelConfig = ParallelConfig()
    """Data-parallel ranks and weight sharding."""
    ckpt: CheckpointConfig = CheckpointConfig()
    """Checkpoints, to continue from with `--resume`."""
    resume: ResumeConfig | None = None
    """Continue from a checkpoint in this run folder with the same config: `--resume` (the latest) or
    `--resume.step N`; the same steps, data order and weights as a run that never stopped. What the run
    wrote after that step is dropped. Absent: a new run."""

    @model_validator(mode="after")
    def _quantized_base_trains_lora(self) -> SFTConfig:
        if self.model.quantization != "none" and self.model.lora is None:
            raise ValueError(
                f"model.quantization = {self.model.quantization!r} freezes the base in 4 bits: add [model.lora] "
                "to train an adapter on it, or leave quantization at 'none' for full fine-tuning"
            )
        check_quantized_base(self.model, self.parallel.fsdp, "parallel.fsdp")
        return self
