"""`[trainer]`: the optimizer, its schedule, the loss (config/algorithms.py), forward passes,
checkpoints and data parallelism of the trainer process (`lorarl-trainer`; `sft` shares the optimizer,
schedule, checkpoint and parallel sections)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from lorarl.config.algorithms import LossConfig, PPOLoss, upgrade_loss
from lorarl.config.common import DEFAULT_LOGITS_CHUNK_SIZE, LOGITS_CHUNK_DOC, Section


class OptimConfig(Section):
    lr: float = Field(5e-5, gt=0)
    """AdamW learning rate, reached after warmup (the scheduler scales it from there)."""
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    """AdamW's (beta1, beta2): decay rates of its running averages of the gradient and its square."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW's decoupled weight decay of the trained parameters; 0: none."""
    max_norm: float = Field(1.0, gt=0)
    """Gradient clipping: the gradient is scaled down to this global L2 norm where it is larger (the
    logged grad_norm is the norm before clipping)."""
    max_skipped_steps: int = Field(3, ge=1)
    """A step whose loss or gradient is NaN or infinite changes no weight (skipped, counted in
    `skipped_steps`); this many such steps in a row stop the run, as do this many in a row whose
    gradient is exactly 0 although they had a loss to learn from (saturated weights: lr far too high).
    An update that makes a weight NaN or infinite stops it at once: no such adapter is ever written."""


class SchedulerConfig(Section):
    type: Literal["constant", "linear", "cosine"] = "constant"
    """The learning rate after warmup: "constant" keeps lr; "linear" lowers it linearly, and "cosine" along
    half a cosine, to 0 at max_steps."""
    warmup_steps: int = Field(0, ge=0)
    """Steps over which the learning rate rises linearly from lr / warmup_steps to lr; 0: no warmup."""


class CheckpointConfig(Section):
    interval: int | None = Field(None, ge=1)
    """Write checkpoints/step_N/ every N steps: trainer/ (the adapter, or all weights in full fine-tuning;
    optimizer, scheduler, RNG states, step and in `sft` the data position) and in `rl` orchestrator/ (its
    position in every environment's example stream). None: no checkpoints."""
    keep_last: int | None = Field(3, ge=1)
    """Keep only the newest N checkpoints, deleting older ones as new ones are written, so that a long
    run does not fill the disk; None: keep all."""


class ParallelConfig(Section):
    dp: int = Field(1, ge=1)
    """Data-parallel ranks: above 1, torchrun starts the trainer (in `sft`, the whole program) as N ranks
    (gloo on CPU, NCCL on GPU), each on its share of every batch; gradients are summed and rank 0 writes
    broadcasts, checkpoints and metrics. 1: a single process."""
    fsdp: bool = False
    """Also shard the model's weights (frozen base and adapter) over the dp ranks with FSDP2, one shard
    group per decoder layer, for models that don't fit one device; needs dp >= 2. Results and
    checkpoints are those of a run without it. Tested on CPU with gloo only. False: every rank holds
    all weights."""

    @model_validator(mode="after")
    def _fsdp_shards_over_ranks(self) -> ParallelConfig:
        if self.fsdp and self.dp < 2:
            raise ValueError(f"fsdp = true shards the weights over the dp ranks, so it needs dp >= 2 (dp = {self.dp})")
        return self


class ForwardPassConfig(Section):
    """How a trainer process runs its forward and backward passes, on which devices: what `rl`'s trainer
    and `lorarl-serve`'s share."""

    micro_batch_size: int = Field(16, ge=1)
    """Samples per forward/backward pass, or with packing rows of up to seq_len tokens (the same bound on
    tokens per pass); gradients accumulate over a step's passes."""
    packing: bool = True
    """Put several samples into each row, each with position ids from 0 and attention only within itself,
    as in `sft`: the same loss, gradients and metrics up to float rounding, with less padding (a multi-turn
    sample that overran seq_len gets a row of its own). False: one sample per padded row."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass: far less activation memory, for one more
    forward pass per micro-batch. False: keep them."""
    logits_chunk_size: int = Field(DEFAULT_LOGITS_CHUNK_SIZE, ge=0, description=LOGITS_CHUNK_DOC)
    num_threads: int | None = Field(None, ge=1)
    """Torch CPU threads of each trainer rank. None: torch's default (every core), except that `rl`
    starting vLLM workers on a machine without a GPU and without inference.time_share leaves the
    workers' cores to them (sharing a core with a generating worker is about 4x slower)."""
    parallel: ParallelConfig = ParallelConfig()
    """Data-parallel trainer ranks and weight sharding."""
    gpu_ids: list[Annotated[int, Field(ge=0)]] | None = None
    """GPUs of the trainer's ranks, one per rank (parallel.dp of them), as indices among the GPUs `rl`
    sees: rank i runs on gpu_ids[i]. None: the first parallel.dp GPUs that vLLM does not use (with
    inference.colocate_with_trainer: the first parallel.dp GPUs). Unused without GPUs."""


class TrainerConfig(ForwardPassConfig):
    optim: OptimConfig = OptimConfig()
    """The optimizer, AdamW."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """The learning-rate schedule."""
    loss: LossConfig = PPOLoss()
    """The policy loss, by type ("ppo", "mask", "cispo", "importance_sampling", "cross_entropy", "custom")
    with its own keys, and what every type shares: normalization, KL penalty, entropy bonus, trainer-vLLM
    mismatch correction (config/algorithms.py)."""
    share_prompts: bool = True
    """With packing, the rollouts of a group that start with the same prompt compute it once per row:
    the prompt is packed once, and each rollout's completion attends to it and to itself, with the same
    loss and gradients up to float rounding. A group of n rollouts then costs one prompt and n
    completions instead of n of each; such rows are up to 2 x seq_len wide, with fewer rows per pass.
    Not with flash attention (model.attn_implementation), which packs whole samples."""
    batch_timeout: float = Field(1800.0, gt=0)
    """Seconds the trainer waits for the next rollout batch before giving up (the orchestrator may have died)."""
    keep_rollouts: bool = False
    """Keep rollouts/step_N after the trainer has trained on it (to inspect every batch later);
    false: delete it then (a resumed run samples its batches again; samples/ keeps a few decoded)."""
    policy_gap_interval: int | None = Field(None, ge=1)
    """Every N steps, split the trainer/vLLM logprob gap of the batch into mismatch/policy_moved (the
    trainer now against the trainer at each rollout's policy version) and mismatch/serving (the trainer at
    that version against vLLM): means of |Δ log π| over the loss tokens. It keeps the adapter weights of
    the last max_async_level + 1 versions in host memory and costs one more no_grad forward pass of the
    batch, and one of its samples of older versions, on the steps it runs (time/policy_gap). LoRA only,
    without fsdp. None: never."""
    ckpt: CheckpointConfig = CheckpointConfig()
    """Checkpoints of the trainer and the orchestrator, to continue from with `--resume`."""

    @field_validator("loss", mode="before")
    @classmethod
    def _loss_type(cls, data: Any) -> Any:
        return upgrade_loss(data)
