"""Pydantic models for every config section. Defaults here are the documented defaults.

An `rl` TOML has the sections of `RLConfig`; an `sft` TOML those of `SFTConfig`. Every model
forbids unknown keys, so a typo stops the program before anything starts.

Each field's docstring is its one documentation: `--help` shows it, and scripts/config_reference.py
renders the config reference (docs/config.md) from it, so the two cannot drift apart.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

# vLLM's --max-lora-rank accepts only these values (docs/vllm.md).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Targets per chunk of the output head and its log-softmax (trainer/loss.py): a 151,936-token vocabulary
# makes a chunk's float32 logits 78 MB, so the vocabulary costs a fixed ~0.3 GB instead of growing with
# the row (docs/real_shapes.md: 1.2-1.4x the peak of a 259-token vocabulary, against 1.7-2.1x at 512).
# Liger-Kernel's fused linear cross-entropy picks 64-256 rows for Qwen3's shapes, for the same reason.
DEFAULT_LOGITS_CHUNK_SIZE = 128
# A run folder's name, with room for the names lorarl derives from it (adapters `<run_name>-step<N>`),
# within the 255 bytes a file system gives a file name.
_MAX_RUN_NAME = 200
LOGITS_CHUNK_DOC = (
    "Tokens per chunk of the output head: log-probabilities and entropies are computed over the vocabulary "
    "this many tokens at a time and recomputed in the backward pass, so no [tokens x vocab] float32 tensor is "
    "ever whole (with Qwen3's 151,936-token vocabulary, 0.6 GB per 1,000 tokens). Same loss and gradients up "
    "to float rounding, for one more pass of the output head. 0: the whole forward pass at once, nothing "
    "recomputed (the fastest for small vocabularies and short rows)."
)
# A path the user may write with "~": expanded once, when the config is validated, so that every
# process (vLLM, trainer, orchestrator, each reading the config rl wrote) gets the same folder.
UserPath = Annotated[Path, AfterValidator(lambda path: path.expanduser())]
# A seed every consumer takes: vLLM seeds numpy with --seed, which accepts 0 .. 2**32 - 1 only.
Seed = Annotated[int, Field(ge=0, lt=2**32)]


class Section(BaseModel):
    # Field docstrings become the field descriptions, which `--help` shows.
    # No NaN or infinity anywhere: an `lr = inf` would train a NaN adapter.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True, allow_inf_nan=False
    )


class LoraConfig(Section):
    rank: int = Field(8, ge=1, le=VLLM_LORA_RANKS[-1])
    """LoRA rank r: the inner dimension of each adapted module's two low-rank matrices. At most 512,
    vLLM's largest `--max-lora-rank`; `rl` starts vLLM with the smallest value it accepts that holds r."""
    alpha: float = 16.0
    """LoRA scaling: the adapter's output is multiplied by alpha / rank (alpha / sqrt(rank) with use_rslora)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability on the input of every LoRA branch while training; 0: no dropout."""
    use_rslora: bool = False
    """Rank-stabilized LoRA: scale by alpha / sqrt(rank) instead of alpha / rank; false: alpha / rank."""
    target_modules: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Modules that get a LoRA adapter, as in PEFT: a list of module names or dotted suffixes (such as
    "self_attn.q_proj"; names the model lacks are ignored), or a string: a regex that must match whole
    module paths such as "model.layers.0.self_attn.q_proj", or "all-linear" (every linear layer but the
    output head). Adapting no module at all is an error. The default, the attention and MLP
    projections, is there because attention-only LoRA underperforms in RL.
    MoE: transformers 5 stores experts as fused 3D parameters, not linear layers; on Qwen3-MoE (and
    the other MoE models PEFT converts from their transformers 4 layout) PEFT maps gate_proj + up_proj
    onto mlp.experts.gate_up_proj at rank 2r and down_proj onto mlp.experts.down_proj, one LoRA per
    expert; the router (mlp.gate) stays frozen unless targeted ("all-linear" adds it). `sft` and `rl`
    train them; `rl` serves them through vLLM in that fused layout (--enable-mixed-moe-lora-format,
    --max-lora-rank 2r, is_3d_lora_weight on each load), which needs a GPU build of vLLM: on the CPU it
    refuses expert LoRA before anything starts. `rl` needs gate_proj, up_proj and down_proj targeted
    together or not at all (vLLM reads one alone wrongly; docs/moe.md)."""
    exclude_modules: list[str] | str = []
    """Modules left out of target_modules, in the same form: a list of module names or dotted suffixes,
    or a regex string; []: none left out."""
    modules_to_save: list[str] = []
    """Modules trained in full and saved with the adapter, matched as path suffixes (e.g. ["lm_head"]);
    []: none. `sft` only: `rl` refuses them, also in an init_adapter, because vLLM serves LoRA weights only."""
    init_adapter: UserPath | None = None
    """A PEFT adapter folder to start from (e.g. an `sft` result); its rank, alpha and use_rslora must
    match this section. None: a fresh adapter, whose B = 0 makes it exactly the base model."""

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
            raise ValueError(
                f"list items are module names such as 'q_proj', not patterns: {bad}; "
                "give a single string for a regular expression"
            )
        return value

    @staticmethod
    def _is_module_name(name: str) -> bool:
        """A module name or dotted path ("q_proj", "self_attn.q_proj"), not a regular expression."""
        return all(part and all(c.isalnum() or c == "_" for c in part) for part in name.split("."))


class ModelConfig(Section):
    name: Annotated[str, AfterValidator(os.path.expanduser)]
    """The base model: a Hugging Face model folder (or a hub id where a hub is reachable), which the
    trainer and vLLM load."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The dtype the trainer loads the weights in, and vLLM's `--dtype`: "float32", "bfloat16" or "float16"."""
    attn_implementation: Literal[
        "packed_sdpa", "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"
    ] = "packed_sdpa"
    """The trainer's transformers attention implementation (vLLM picks its own). "packed_sdpa": lorarl's,
    sdpa on each packed sample (and shared prompt) on its own, so attention costs what the samples do, not
    the square of the row (docs/attention.md); plain sdpa for unpacked rows and for rows of at most 256
    tokens, where one call with a dense mask costs less. "flex_attention": a
    FlexAttention block mask (trains on GPUs only). "sdpa", "eager": a dense block-diagonal mask per
    packed row. "flash_attention_2", "flash_attention_3" (where installed): boundaries from position ids,
    no shared prompts."""
    lora: LoraConfig | None = None
    """The LoRA adapter to train. `rl` trains one (absent: the defaults below) unless full_finetune is set;
    absent in an `sft` config means full fine-tuning of every weight."""
    full_finetune: bool = False
    """Train every weight of the model, with no LoRA adapter (leave out [model.lora]). In `rl` every
    policy version is then a whole model that each vLLM worker reloads in place (vLLM's reload_weights),
    replacing the last one: requests in flight (an eval's too) finish on the new weights, so its
    workers serve this run alone (no [[variants]]). In `sft` the same as leaving out [model.lora].
    false: LoRA."""

    @model_validator(mode="after")
    def _lora_or_full(self) -> ModelConfig:
        if self.full_finetune and self.lora is not None:
            raise ValueError("model.full_finetune trains every weight, so [model.lora] has no adapter to set: drop one")
        return self


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


class LossConfig(Section):
    ratio_level: Literal["token", "sequence"] = "token"
    """What the importance ratio π_trainer / π_vLLM is taken of: "token": each token; "sequence": each
    sample, exp of the mean token log-ratio over its loss tokens (the geometric mean of GSPO, which uses
    a far narrower region, e.g. ratio_low 3e-4, ratio_high 4e-4)."""
    ratio_mode: Literal["clip", "mask", "cispo"] = "clip"
    """What happens to tokens or samples whose ratio leaves the trust region [1 - ratio_low, 1 + ratio_high]:
    "clip": PPO-clipped; "mask": they carry no gradient; "cispo": CISPO (MiniMax-M1), each token's loss is
    -sg(clip(ratio)) * A * log π_trainer, so clipped tokens keep a gradient, through log π_trainer, at a
    capped weight without gradient (sg)."""
    ratio_low: float = Field(0.2, ge=0)
    """Lower width of the trust region: ratios below 1 - ratio_low are clipped or masked (ratio_mode)."""
    ratio_high: float = Field(0.28, ge=0)
    """Upper width of the trust region: ratios above 1 + ratio_high are clipped or masked (ratio_mode)."""
    norm: Literal["token", "sequence", "constant"] = "token"
    """What the loss summed over loss tokens is divided by: "token": the step's loss tokens; "sequence":
    each sample's loss tokens, then the step's samples (as GRPO); "constant": norm_constant (as Dr. GRPO)."""
    norm_constant: float | None = Field(None, gt=0)
    """The divisor of norm = "constant", e.g. batch_size * max_tokens; None: unset, which only the other
    norms allow."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a per-token KL penalty to the base model, the k3 estimator exp(d) - d - 1 with
    d = log π_base - log π_trainer, where π_base is the same weights with the adapter disabled. 0: no
    penalty; above 0 it costs one more forward per micro-batch and is logged as kl_to_base."""
    mismatch_correction: Literal["none", "tis", "mis", "icepop"] = "none"
    """Importance sampling of the gap between the trainer and vLLM, apart from the trust region, by the
    weight w = π_old / π_vLLM without gradient, where π_old is the trainer's policy before this step's
    update (per token or per sample: mismatch_level). "tis": truncated IS, each token's policy loss times
    min(w, mismatch_cap); "mis": masked IS, times w where w <= mismatch_cap and 0 above; "icepop": IcePop's
    two-sided masked IS, times w where mismatch_low <= w <= mismatch_cap and 0 outside. The trust-region
    ratio is then π_trainer / π_old, which is 1 at the trainer's one update per batch, so the trust
    region no longer clips or masks. Logged as mismatch/capped_frac ("tis") or mismatch/masked_frac
    and mismatch/weight_mean. "none": the trust-region ratio is π_trainer / π_vLLM itself."""
    mismatch_cap: float = Field(2.0, ge=1)
    """The cap of mismatch_correction: weights w above it are truncated to it ("tis") or zeroed ("mis",
    "icepop")."""
    mismatch_low: float = Field(0.5, gt=0, le=1)
    """The lower bound of mismatch_correction = "icepop": weights w below it are zeroed."""
    mismatch_geo_mask: float | None = Field(None, gt=1)
    """Geometric-mean sequence masking, with any mismatch_correction or none: a sample whose geometric-mean
    weight exp(mean over its loss tokens of log π_old - log π_vLLM) is outside [1 / mismatch_geo_mask,
    mismatch_geo_mask] carries no policy gradient (SkyRL's geometric sequence mask, e.g. 1.01). Logged as
    mismatch/geo_masked_frac, the fraction of loss tokens in masked samples. None: no such mask."""
    mismatch_level: Literal["token", "sequence"] = "token"
    """What the mismatch weight w is taken of: "token": each token; "sequence": each sample, the product of
    its loss tokens' weights (the sample's likelihood ratio, not GSPO's geometric mean), for all its tokens."""
    entropy_coef: float = Field(0.0, ge=0)
    """Weight of an entropy bonus: entropy_coef times the entropy of the policy at the sampling temperature
    is subtracted from each loss token's loss, normalized as the policy term (norm). 0: no bonus; above 0
    the entropy is computed with gradient, which keeps one more tokens x vocabulary tensor for the backward."""
    loss_fn: str | None = None
    """A custom policy term, "package.module:function" marked @lorarl.plugin("loss"), a lorarl.LossFn: a
    function of a lorarl.LossInputs (the forward batch's per-token trainer and vLLM logprobs, advantages,
    loss mask, sample index, norm weights, and this section) returning the per-token loss, or it and a dict
    of scalar metrics (means over the batch's loss tokens, logged as loss_fn/<name>). It replaces ratio and
    trust region; lorarl still applies norm and adds the KL penalty and the entropy bonus. None: built-in."""

    @field_validator("loss_fn", mode="after")
    @classmethod
    def _module_colon_function(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", value):
            raise ValueError(f"{value!r} is not of the form 'package.module:function'")
        return value

    @model_validator(mode="after")
    def _constant_norm_has_its_constant(self) -> LossConfig:
        if self.norm == "constant" and self.norm_constant is None:
            raise ValueError('norm = "constant" needs norm_constant (e.g. batch_size * max_tokens)')
        return self

    @model_validator(mode="after")
    def _custom_loss_does_its_own_correction(self) -> LossConfig:
        if self.loss_fn is not None and self.mismatch_correction != "none":
            raise ValueError(
                f"loss_fn {self.loss_fn} gets the vLLM logprobs and corrects for them itself: "
                f'mismatch_correction = "{self.mismatch_correction}" would correct twice; leave it "none"'
            )
        if self.loss_fn is not None and self.mismatch_geo_mask is not None:
            raise ValueError(
                f"loss_fn {self.loss_fn} gets the vLLM logprobs and masks for them itself: leave mismatch_geo_mask out"
            )
        return self


class CheckpointConfig(Section):
    interval: int | None = Field(None, ge=1)
    """Write checkpoints/step_N/ every N steps: trainer/ (the adapter, or all weights in full fine-tuning;
    optimizer, scheduler, RNG states, step and in `sft` the data position) and in `rl` orchestrator/ (its
    position in every environment's example stream). None: no checkpoints."""
    keep_last: int | None = Field(3, ge=1)
    """Keep only the newest N checkpoints, deleting older ones as new ones are written, so that a long
    run does not fill the disk; None: keep all."""


class ResumeConfig(Section):
    step: int | None = Field(None, ge=1)
    """The checkpoint to resume from, checkpoints/step_N (`--resume.step N`); None: the latest (`--resume`)."""


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


class TrainerConfig(Section):
    optim: OptimConfig = OptimConfig()
    """The optimizer, AdamW."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """The learning-rate schedule."""
    loss: LossConfig = LossConfig()
    """The policy-gradient loss: importance ratio, trust region, normalization, KL penalty, trainer-vLLM
    mismatch correction, entropy bonus, or a custom loss."""
    micro_batch_size: int = Field(16, ge=1)
    """Samples per forward/backward pass, or with packing rows of up to seq_len tokens (the same bound on
    tokens per pass); gradients accumulate over a step's passes."""
    packing: bool = True
    """Put several samples into each row, each with position ids from 0 and attention only within itself,
    as in `sft`: the same loss, gradients and metrics up to float rounding, with less padding (a multi-turn
    sample that overran seq_len gets a row of its own). False: one sample per padded row."""
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
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass: far less activation memory, for one more
    forward pass per micro-batch. False: keep them."""
    logits_chunk_size: int = Field(DEFAULT_LOGITS_CHUNK_SIZE, ge=0, description=LOGITS_CHUNK_DOC)
    policy_gap_interval: int | None = Field(None, ge=1)
    """Every N steps, split the trainer/vLLM logprob gap of the batch into mismatch/policy_moved (the
    trainer now against the trainer at each rollout's policy version) and mismatch/serving (the trainer at
    that version against vLLM): means of |Δ log π| over the loss tokens. It keeps the adapter weights of
    the last max_async_level + 1 versions in host memory and costs one more no_grad forward pass of the
    batch, and one of its samples of older versions, on the steps it runs (time/policy_gap). LoRA only,
    without fsdp. None: never."""
    num_threads: int | None = Field(None, ge=1)
    """Torch CPU threads of each trainer rank. None: torch's default (every core), except that `rl`
    starting vLLM workers on a machine without a GPU and without inference.time_share leaves the
    workers' cores to them (sharing a core with a generating worker is about 4x slower)."""
    parallel: ParallelConfig = ParallelConfig()
    """Data-parallel trainer ranks and weight sharding."""
    ckpt: CheckpointConfig = CheckpointConfig()
    """Checkpoints of the trainer and the orchestrator, to continue from with `--resume`."""
    gpu_ids: list[Annotated[int, Field(ge=0)]] | None = None
    """GPUs of the trainer's ranks, one per rank (parallel.dp of them), as indices among the GPUs `rl`
    sees: rank i runs on gpu_ids[i]. None: the first parallel.dp GPUs that vLLM does not use (with
    inference.colocate_with_trainer: the first parallel.dp GPUs). Unused without GPUs."""


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of rollouts; the trainer divides its logits by the same value (carried in each
    rollout), so that its logprobs match vLLM's."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: sample from the most likely tokens whose probabilities add up to top_p; 1: all
    tokens. vLLM renormalizes over the kept tokens and returns the logprobs of that distribution (its
    `--logprobs-mode processed_logprobs`, which lorarl starts it with); the trainer keeps the same tokens
    of its own distribution and renormalizes alike, so that the importance ratio is of the distribution
    sampled from (docs/off_policy.md)."""
    top_k: int | None = Field(None, ge=1)
    """Sample from the top_k most likely tokens only (ties at the k-th kept), before top_p; the trainer
    keeps the same tokens, as for top_p. None: all tokens."""
    max_tokens: int = Field(128, ge=1)
    """Most tokens generated per model turn (fewer where the episode would outgrow seq_len); a turn that
    hits it counts as truncated."""


ADVANTAGE_FN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


class AdvantageConfig(Section):
    estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    """How each rollout's (shaped) reward r_i becomes its advantage against the other rollouts of its group:
    "grpo": (r_i - group mean) / (group std + 1e-6); "dr_grpo": r_i - group mean, unscaled (Dr. GRPO);
    "rloo": r_i - the mean of the group's other rewards (leave-one-out). A group whose rewards are all equal
    gets advantages of exactly 0 from each of them."""
    fn: str | None = None
    """Your own estimator in place of `estimator` (leave that at its default): "package.module:function"
    marked @lorarl.plugin("advantage") (lorarl.AdvantageFn), called with the group's rewards (a list of
    floats) and, if it takes a second argument, the group's episodes (lorarl.PlayedEpisode: `.episode` with
    the messages and example, `.model_tokens`, `.truncated`); it returns one finite advantage per reward.
    Imported when the orchestrator starts. None: `estimator`."""
    std_normalize: bool | None = None
    """The older switch between the two group-mean estimators, still read: false makes estimator "grpo" into
    "dr_grpo"; true keeps "grpo". None: estimator alone decides."""

    @model_validator(mode="before")
    @classmethod
    def _std_normalize_picks_a_group_mean_estimator(cls, data: Any) -> Any:
        if not (isinstance(data, dict) and data.get("std_normalize") is not None):
            return data
        estimator, normalize = data.get("estimator", "grpo"), bool(data["std_normalize"])
        if data.get("fn") is not None or estimator not in ("grpo", "dr_grpo") or (normalize and estimator != "grpo"):
            raise ValueError(
                f"std_normalize = {str(normalize).lower()} does not go with "
                + (f"fn = {data['fn']!r}" if data.get("fn") is not None else f'estimator = "{estimator}"')
                + ': leave std_normalize out (it only picks between "grpo" and "dr_grpo")'
            )
        return {**data, "estimator": "grpo" if normalize else "dr_grpo"}

    @model_validator(mode="after")
    def _fn_is_module_colon_function(self) -> AdvantageConfig:
        if self.fn is not None:
            if not ADVANTAGE_FN.match(self.fn):
                raise ValueError(f"fn {self.fn!r}: give 'package.module:function'")
            if self.estimator != "grpo":
                raise ValueError(f'fn replaces the estimator: set fn or estimator = "{self.estimator}", not both')
        return self


class OverlongConfig(Section):
    mask_truncated: bool = False
    """Give every truncated episode (its last model turn hit max_tokens) advantage 0, so it trains neither
    way (DAPO's overlong filtering); the group's other advantages are computed as usual, its reward
    included. Counted in `overlong/masked`. False: truncated episodes train like the others."""
    buffer: int = Field(0, ge=0)
    """Soft overlong penalty (DAPO's overlong reward shaping): an episode whose longest model turn runs
    into the last `buffer` tokens before sampling.max_tokens loses penalty * (tokens into the buffer) /
    buffer of reward, the full penalty when truncated. The estimator sees the shaped reward; `reward`
    metrics stay the environment's, and the penalty is logged as `env/<env>/overlong_penalty`. 0: no
    penalty."""
    penalty: float = Field(1.0, ge=0)
    """The reward an episode loses at max_tokens (with buffer > 0)."""


class DifficultyFilterConfig(Section):
    window: int = Field(2, ge=1)
    """Attempts remembered per example (an attempt: one group of it; its pass rate: the group's mean
    reward, the fraction solved when rewards are 0 or 1). An example is skipped once each of its last
    `window` attempts was at or above max_pass, or each at or below min_pass."""
    max_pass: float | None = 1.0
    """Too easy: an example whose last `window` attempts all had a pass rate >= this is no longer drawn.
    None: never skipped as too easy."""
    min_pass: float | None = 0.0
    """Too hard: an example whose last `window` attempts all had a pass rate <= this is no longer drawn.
    None: never skipped as too hard."""
    capacity: int = Field(100_000, ge=1)
    """Examples remembered at most; the one attempted longest ago is forgotten first (and may be drawn again)."""

    @model_validator(mode="after")
    def _pass_range(self) -> DifficultyFilterConfig:
        if self.min_pass is not None and self.max_pass is not None and self.min_pass >= self.max_pass:
            raise ValueError(f"min_pass ({self.min_pass}) must be below max_pass ({self.max_pass})")
        return self


class EnvConfig(Section):
    id: str = "reverse_text"
    """A built-in environment ("reverse_text", "alphabet_sort", "unscramble", "math", "search", "calculator"),
    a reasoning-gym task ("reasoning_gym:<task>", or "reasoning_gym" with args.tasks), a verifiers taskset
    ("verifiers:<taskset package or module>", args: its config, and max_turns) or "package.module:factory": an
    Environment subclass, a function annotated to return one, or one marked @lorarl.plugin("environment")."""
    weight: float = Field(1.0, gt=0)
    """Relative probability that a group plays this environment, against the other environments' weights."""
    args: dict[str, Any] = {}
    """Keyword arguments of the environment's constructor or factory, checked against its signature and
    annotations and converted to the annotated types; {}: its defaults."""
    episode_timeout: float | None = Field(None, gt=0)
    """Wall-clock seconds an episode may run from its start; once past, it ends after its last finished model
    turn (a slow tool or environment reply is cut off) and is scored as it stands; counted in `timed_out_frac`.
    None: the environment's own limit (none for the built-ins)."""


class EvalConfig(Section):
    interval: int = Field(10, ge=1)
    """Evaluate policy versions 0, interval, 2 * interval, ... and the last, each in the background
    while training goes on (a run ends once its last eval is done)."""
    num_examples: int = Field(16, ge=1)
    """Held-out examples per environment, the same at every eval."""
    rollouts_per_example: int = Field(4, ge=1)
    """k of avg@k (the mean reward) and pass@k (the mean over examples of the best of k rewards)."""
    seed: Seed = 10_000
    """Draws the held-out examples (0 to 2**32 - 1); keep it apart from orchestrator.seed, or the eval
    examples are the first training examples."""


class OrchestratorConfig(Section):
    batch_size: int = Field(64, ge=1)
    """Rollouts per trainer step: batch_size / rollouts_per_example groups."""
    rollouts_per_example: int = Field(8, ge=1)
    """Rollouts of one example, the group whose mean reward is each one's baseline; divides batch_size."""
    max_async_level: int = Field(1, ge=0)
    """How far sampling runs ahead of training: a group drawn for step N is sampled with a policy version
    >= N - 1 - max_async_level. 0: fully on-policy, each batch waits for the trainer; 1: the next batch
    is sampled while the trainer trains."""
    max_off_policy_steps: int | None = Field(None, ge=0)
    """Continuous batching: a batch takes the first groups to finish, oldest policy first, so a slow group
    rolls over into a later batch, and one that would lag more than this many versions is dropped
    (counted in dropped/groups) and replaced; at least max_async_level. None: each batch holds exactly
    the groups drawn for its step and waits for the slowest. vLLM's `--max-loras` follows the larger of
    the two."""
    sampling: SamplingConfig = SamplingConfig()
    """How vLLM samples rollouts (evals too)."""
    advantage: AdvantageConfig = AdvantageConfig()
    """How rewards become advantages, against the other rollouts of the same example."""
    skip_zero_advantage: bool = True
    """Leave groups whose advantages are all 0 (every rollout rewarded the same) out of the batch the trainer
    gets: they carry no policy gradient, yet would cost a forward and backward pass. Counted in
    `groups/zero_advantage` and `rollouts/skipped`. The loss is then normalized over the rollouts trained
    on (with loss.norm = "constant" the gradient is the same; with kl_coef > 0 the skipped rollouts'
    KL term is left out too). A step whose groups all have zero advantage gets an empty batch, and the
    trainer changes no weight at that step. False: every group trains."""
    fill_informative: bool = False
    """Dynamic sampling (DAPO): when a step's groups have finished and some had zero advantage, draw that many
    more groups for the step (from a second example stream, so the first stays as without it), and again,
    until batch_size rollouts with non-zero advantage are in, or fill_max_draw_factor is reached; then the
    batch goes out with what it has (`fill/bound_hit`). Extra groups play the newest policy, are counted in
    `groups/extra_drawn`, and are drawn for the step being assembled only, so which examples a step trains
    on does not depend on timing. Needs skip_zero_advantage. False: a step draws its
    batch_size / rollouts_per_example groups only."""
    fill_max_draw_factor: float = Field(3.0, ge=1)
    """With fill_informative: a step draws at most this many times its batch_size / rollouts_per_example
    groups in all, extra groups included (DAPO's max_num_gen_batches), so that a task the policy always
    solves or always fails cannot hold the run up."""
    difficulty_filter: DifficultyFilterConfig | None = None
    """Online difficulty filtering: remember each example's recent pass rates (examples are told apart by
    their environment and JSON) and stop drawing those solved, or failed, in every recent attempt; counted
    per step in `difficulty/skipped_easy` and `difficulty/skipped_hard`. A group drawn for step N sees the
    attempts of batches up to N - 1 - max_async_level, all of which are written before it is drawn, so the
    examples do not depend on timing. After 1000 skips in a row the next example is taken anyway
    (`difficulty/forced`). Absent: every example drawn is played."""
    overlong: OverlongConfig = OverlongConfig()
    """Episodes that run into max_tokens: masked from the loss, or their reward lowered near the limit."""
    env: list[EnvConfig] = [EnvConfig()]
    """The training environments, one [[orchestrator.env]] table each with keys id, weight and args (on the
    command line a JSON list of such objects); absent: one "reverse_text"."""
    seed: Seed = 0
    """Draws each group's environment and example (0 to 2**32 - 1); the same seed gives the same example
    stream."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra variables for the model's chat template when it renders episodes, e.g. { enable_thinking = false }
    for Qwen3 (which then opens each answer with an empty <think> block that later turns do not repeat, so
    multi-turn episodes split into a sample per turn: `split_frac`)."""
    policy_timeout: float = Field(1800.0, gt=0)
    """Seconds the orchestrator waits for the trainer's next adapter before giving up (the trainer may
    have died)."""
    num_samples_to_log: int = Field(4, ge=0)
    """Decoded rollouts per step, with their rewards, written to samples/step_N.jsonl; 0: none."""
    eval: EvalConfig | None = None
    """Evals on held-out examples of every environment, logged as `eval/<env>/avg@k` and `pass@k` with the
    policy version as step; absent: no evals."""
    delete_old_broadcasts: bool = True
    """Delete broadcasts/step_N once no worker serves version N any more (the final one stays; checkpoints
    keep their own copy); false: keep every version."""

    @model_validator(mode="after")
    def _groups_fill_batch(self) -> OrchestratorConfig:
        if self.batch_size % self.rollouts_per_example:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of rollouts_per_example "
                f"({self.rollouts_per_example})"
            )
        return self

    @model_validator(mode="after")
    def _groups_of_several(self) -> OrchestratorConfig:
        # A custom estimator (advantage.fn) may not need a group: rl warns about it instead (preflight).
        if self.rollouts_per_example == 1 and self.advantage.fn is None:
            raise ValueError(
                f'rollouts_per_example = 1 with advantage.estimator = "{self.advantage.estimator}": each '
                "rollout is its own group's baseline, so every advantage is 0 and nothing trains; use 2 or more"
            )
        return self

    @model_validator(mode="after")
    def _fill_needs_skipping(self) -> OrchestratorConfig:
        if self.fill_informative and not self.skip_zero_advantage:
            raise ValueError(
                "fill_informative fills the batch in place of the zero-advantage groups that "
                "skip_zero_advantage leaves out: set skip_zero_advantage = true too"
            )
        return self

    @model_validator(mode="after")
    def _overlong_buffer_fits(self) -> OrchestratorConfig:
        if self.overlong.buffer > self.sampling.max_tokens:
            raise ValueError(
                f"overlong.buffer ({self.overlong.buffer}) is longer than sampling.max_tokens "
                f"({self.sampling.max_tokens})"
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
    startup_timeout: float = Field(600.0, gt=0)
    """Seconds to wait for every vLLM server to answer /health before giving up."""
    extra_args: list[str] = []
    """More arguments for every vLLM server `rl` starts, appended to its command (e.g. ["--enforce-eager"]);
    a `--max-loras` here replaces the derived one and must hold max_policy_lag + 2 adapters (for each
    of the [[variants]], if any). []: none."""
    unavailable_timeout: float = Field(300.0, gt=0)
    """Seconds the orchestrator keeps retrying while no worker answers (each failing worker is taken
    out of routing and put back once healthy, with the adapters in use); then the run stops."""
    request_timeout: float = Field(60.0, gt=0)
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
    served-adapter check. None: follows model.dtype, 1e-3 for float32 and 0.25 for bfloat16/float16."""

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

    @field_validator("urls", mode="after")
    @classmethod
    def _urls_are_server_addresses(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if problem := _url_problem(url):
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
        if self.api_key is None and not _is_loopback(self.host):
            raise ValueError(
                f"inference.api_key is required when inference.host ({self.host}) is not a loopback address "
                "(an empty or blank key counts as none)"
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


def _url_problem(url: str) -> str | None:
    """What makes `url` no base URL of an HTTP server, or None."""
    if not url.isprintable() or any(c.isspace() for c in url):
        return "has spaces or unprintable characters"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "does not start with http:// or https://"
    if not parts.hostname:
        return "names no host"
    try:
        parts.port  # noqa: B018  (raises on a port that is not a number in 0..65535)
    except ValueError:
        return "has a port that is not a number from 1 to 65535"
    if parts.port == 0:
        return "has port 0"
    return None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class WandbConfig(Section):
    project: str = "lorarl"
    """The Weights & Biases project the run is logged to, one wandb run per component grouped by run_name."""
    mode: Literal["online", "offline", "disabled"] = "offline"
    """Where wandb data goes: "offline": files in the run folder, for a later `wandb sync`; "online":
    uploaded as the run goes; "disabled": nowhere, as if the table were absent."""


class MonitorConfig(Section):
    jsonl: bool = True
    """Append each component's metrics to metrics.jsonl in the run folder, one JSON object per line;
    false: no metrics file."""
    console: bool = True
    """Show progress on the console: `rl` prints one line per step, `sft` a progress bar with the loss,
    tokens/s and the time left. False: neither (logs still go to logs/)."""
    wandb: WandbConfig | None = None
    """Mirror the metrics to Weights & Biases; absent: no wandb. A [monitor.wandb] table, even empty,
    turns it on."""


class SharedConfig(Section):
    """Top-level keys that every part of a run reads."""

    max_steps: int = Field(20, ge=1)
    """Optimizer steps to train for: each takes one batch (of rollouts in `rl`, of data samples in `sft`);
    the linear and cosine schedules reach 0 here."""
    seq_len: int = Field(512, ge=16)
    """Most tokens of one sample, prompt plus completion: vLLM's `--max-model-len` in `rl`; in `sft`,
    longer examples are cut or left out (data.truncation). With packing, also the width of a row."""
    output_dir: UserPath = Path("outputs")
    """Folder of run folders: a run writes everything to `<output_dir>/<run_name>/`."""
    run_name: str = Field("default", pattern=r"^[A-Za-z0-9._-]+$")
    """Name of the run folder under output_dir, and in `rl` of its adapters in vLLM (`<run_name>-step<N>`),
    so runs sharing servers never touch each other's adapters. Letters, digits, ".", "_" and "-", at most
    200 of them."""
    seed: Seed = 0
    """Seeds torch in the trainer (a fresh adapter's initial weights) and vLLM's sampling (`--seed`); in
    `sft` also the data order and the eval_fraction hold-out. Examples in `rl` follow orchestrator.seed.
    0 to 2**32 - 1."""
    monitor: MonitorConfig = MonitorConfig()
    """Where metrics go: metrics.jsonl, the console, Weights & Biases."""
    keep_freed_memory: bool = True
    """On a CPU, the trainer and the vLLM workers `rl` starts keep the blocks under 32 MiB that a step
    frees (glibc's malloc neither unmaps nor trims them) for the next step to reuse, instead of faulting
    them in again, which a virtual machine pays dearly for (docs/performance.md); the resident size
    stays at the step's peak plus the heap's fragments, somewhat above the memory plan's figures. False:
    blocks of 128 KiB or more go back to the system when freed, for a resident size that follows the
    live tensors. GLIBC_TUNABLES with glibc.malloc settings in the environment win. Unused on a GPU."""
    overwrite: bool = Field(False, exclude=True)
    """Start over in a run folder that holds a previous run, deleting what lorarl wrote there
    (never other files); without it (or `--resume`) such a folder is refused."""
    dry_run: bool = Field(False, exclude=True)
    """Make every check, print the memory plan (docs/memory_plan.md) and start nothing; `rl` also writes
    the run folder's configs/ (per-process configs, commands and the placement of every process). False: run."""
    dry_run_devices: int | None = Field(None, ge=0, exclude=True)
    """With dry_run: place the run as if this machine had this many GPUs (0: none), e.g. to see on a
    laptop where each process of an 8-GPU run would go (`--dry-run --dry-run-devices 8`). None: the GPUs
    this machine has."""
    device_memory_gib: float | None = Field(None, gt=0, exclude=True)
    """Memory of each GPU in GiB for the memory plan that `rl` and `sft` check before starting
    (docs/memory_plan.md). None: what torch reports for this machine's GPUs, or 80 where a dry run
    pretends GPUs (dry_run_devices) or a Ray cluster provides them."""

    @field_validator("run_name", mode="after")
    @classmethod
    def _one_path_component(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError(f"run_name {value!r} would name output_dir or its parent, not a run folder")
        if len(value) > _MAX_RUN_NAME:
            raise ValueError(f"run_name has {len(value)} characters: at most {_MAX_RUN_NAME} (a folder name)")
        return value

    @field_validator("output_dir", mode="before")
    @classmethod
    def _a_folder_for_runs(cls, value: Any) -> Any:
        # A run folder is cleared on --overwrite: it must not be '/' itself, nor the working directory by accident.
        if isinstance(value, str | Path) and (str(value).strip() == "" or Path(value).resolve() == Path("/")):
            raise ValueError(f"output_dir must be a folder for runs, not {str(value)!r}")
        return value

    @model_validator(mode="after")
    def _devices_only_pretend_in_dry_runs(self) -> Self:
        if self.dry_run_devices is not None and not self.dry_run:
            raise ValueError("dry_run_devices only pretends for a dry run: add --dry-run, or leave it out")
        return self

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name


class ClusterConfig(Section):
    backend: Literal["local", "ray"] = "local"
    """Where `rl` starts the vLLM workers and the trainer: "local": subprocesses on this machine; "ray": on
    the nodes of a Ray cluster, through one placement group (docs/ray_cluster.md). The
    orchestrator always runs where `rl` runs."""
    address: str | None = None
    """The Ray cluster to use (backend "ray"): "auto" (the one `ray start` set up on this node), "host:port"
    of its head (GCS), or "ray://host:port" (Ray Client). None: start a Ray instance on this machine for the
    run, and stop it at the end."""
    shared_fs: bool = True
    """Every node sees the run folder at the same path (NFS, Lustre, ...), which is where adapters and
    rollout batches meet; `rl` checks it at start (each node writes a probe file the others must read) and
    stops, naming the nodes, if not. False: ship each adapter version and each rollout batch through Ray's
    object store to node_dir on the nodes that read it."""
    node_dir: Path = Path("/tmp/lorarl-nodes")
    """With shared_fs = false: the folder on every node under which it keeps its copy of the run folder
    (`<node_dir>/<node id>/<run_name>/`)."""
    trainer_resources: dict[str, float] = {}
    """Ray resources added to the bundle of each trainer rank, to pin the trainer to some nodes: a custom
    resource the nodes were started with (`ray start --resources '{"trainer": 1}'`), or Ray's own
    "node:<ip>" (e.g. {"node:10.0.0.5" = 0.01}). {}: any node with the GPU (or CPU) it needs."""
    inference_resources: dict[str, float] = {}
    """Ray resources added to the bundle of each vLLM worker, as trainer_resources. {}: any node with
    tensor_parallel_size GPUs (or a CPU)."""
    placement_timeout: float = Field(300.0, gt=0)
    """Seconds to wait for the Ray cluster to grant every bundle (an autoscaler may add nodes meanwhile);
    then `rl` stops and names the bundles it could not place."""
    connect_timeout: float = Field(10.0, gt=0)
    """Seconds `rl` waits for the Ray head at address ("host:port", "ray://host:port") to accept a
    connection; then it stops with one line naming the address (Ray itself would retry for minutes)."""

    @field_validator("address", mode="after")
    @classmethod
    def _port_in_range(cls, value: str | None) -> str | None:
        port = value.rpartition(":")[2] if value else ""
        if port.isdigit() and not 0 < int(port) < 65536:
            raise ValueError(f"{value!r}: a port is 1-65535")
        return value

    @field_validator("trainer_resources", "inference_resources", mode="after")
    @classmethod
    def _positive_amounts(cls, value: dict[str, float]) -> dict[str, float]:
        if bad := {k: v for k, v in value.items() if not v > 0}:  # NaN included
            raise ValueError(f"{bad}: a bundle asks for a positive amount of each resource")
        return value


VARIANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


class VariantModelConfig(Section):
    lora: dict[str, Any] = {}
    """Keys of [model.lora] this variant sets otherwise (e.g. {rank = 4}), each replacing the top-level
    key; the keys left out are the top-level [model.lora]'s. {}: the top-level adapter settings."""


class VariantTrainerConfig(Section):
    optim: dict[str, Any] = {}
    """Keys of [trainer.optim] this variant sets otherwise (e.g. {lr = 1e-4}), key by key as lora."""
    scheduler: dict[str, Any] = {}
    """Keys of [trainer.scheduler] this variant sets otherwise, key by key as lora."""
    loss: dict[str, Any] = {}
    """Keys of [trainer.loss] this variant sets otherwise, key by key as lora."""


class VariantOrchestratorConfig(Section):
    env: list[EnvConfig] | None = None
    """This variant's training environments, replacing the top-level orchestrator.env list as a whole
    (a list, as [[orchestrator.env]]); None: the top-level environments."""


class VariantConfig(Section):
    """One adapter of a sweep trained on the shared base: its name and what differs for it."""

    name: str = Field(pattern=VARIANT_NAME)
    """The variant's name, unique in the run: its folders are broadcasts/<name>/, rollouts/<name>/,
    samples/<name>/ and checkpoints/<name>/, its vLLM adapters `<run_name>-<name>-step<N>`, and its
    metrics rows carry "variant": name. Letters, digits, "_" and "-", not starting with "_" or "-"."""
    model: VariantModelConfig = VariantModelConfig()
    """What differs from the top-level [model]: only lora (the base model is shared)."""
    trainer: VariantTrainerConfig = VariantTrainerConfig()
    """What differs from the top-level [trainer]: optim, scheduler, loss."""
    orchestrator: VariantOrchestratorConfig = VariantOrchestratorConfig()
    """What differs from the top-level [orchestrator]: env."""


class RLConfig(SharedConfig):
    """`rl`: a trainer that updates a LoRA adapter, an orchestrator that samples and scores rollouts
    through vLLM, and the vLLM servers."""

    model: ModelConfig
    """The base model, and the LoRA adapter trained on it."""
    trainer: TrainerConfig = TrainerConfig()
    """The trainer: one optimizer step on each rollout batch, then the new adapter to broadcasts/step_N."""
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    """The orchestrator: samples rollouts through vLLM, scores them and writes a batch for every step."""
    inference: InferenceConfig = InferenceConfig()
    """The vLLM servers: started by `rl` (`inference` starts one alone), or already running (urls)."""
    cluster: ClusterConfig = ClusterConfig()
    """Where the processes run: this machine, or the nodes of a Ray cluster."""
    variants: list[VariantConfig] = []
    """Several adapters trained at once on one base model and sampled through the same vLLM servers, one
    [[variants]] table each: a sweep in one run. Each variant is the top-level config with its overrides
    applied (model.lora, trainer.optim, trainer.scheduler and trainer.loss key by key, orchestrator.env
    as a whole), and trains on batches of its own with an optimizer of its own; every other key is
    shared. []: one adapter, the top-level [model.lora]."""
    resume: ResumeConfig | None = None
    """Continue from a checkpoint in this run folder, with the same examples as a run that never stopped:
    `--resume` (the latest) or `--resume.step N`. What the run wrote after that step is dropped, and its
    batches and adapters regenerated. Absent: a new run."""
    auto_resume: int = Field(0, ge=0, exclude=True)
    """When the trainer or the orchestrator dies, restart both from the latest complete checkpoint
    (`trainer.ckpt.interval` must be set) up to this many times, keeping the vLLM workers. Not when a
    restart would end the same way: the trainer stopped training gone wrong (NaN weights, a gradient
    stuck at 0: exit code 3), or either refused what it found (exit code 2)."""

    @model_validator(mode="after")
    def _rl_trains_lora(self) -> RLConfig:
        if self.model.lora is None and not self.model.full_finetune:
            self.model.lora = LoraConfig()
        return self

    @model_validator(mode="after")
    def _policy_gap_keeps_adapters(self) -> RLConfig:
        if self.trainer.policy_gap_interval is not None and (self.model.full_finetune or self.trainer.parallel.fsdp):
            what = "model.full_finetune (each version is a whole model)" if self.model.full_finetune else "fsdp"
            raise ValueError(f"trainer.policy_gap_interval keeps the adapter of each version: not with {what}")
        return self

    @model_validator(mode="after")
    def _full_finetune_fits(self) -> RLConfig:
        if self.model.full_finetune and self.variants:
            raise ValueError(
                "[[variants]] are adapters on one shared base model: model.full_finetune trains no adapter"
            )
        if self.model.full_finetune and self.trainer.loss.kl_coef > 0:
            # With LoRA the base is the model with its adapter off; full fine-tuning would need a second copy.
            raise ValueError(
                "trainer.loss.kl_coef > 0 needs the base model beside the policy: not with model.full_finetune"
            )
        return self

    @model_validator(mode="after")
    def _variants_resolve(self) -> RLConfig:
        names = [v.name for v in self.variants]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"variants: names must be unique, {dupes} appear more than once")
        if self.variants and self.trainer.parallel.dp > 1:
            # Each variant's step would need its own collective schedule over the ranks: not built yet.
            raise ValueError("variants train in one trainer process: trainer.parallel.dp must be 1 with [[variants]]")
        self.variant_configs()  # every variant resolves, or the error names its key
        return self

    @property
    def lora(self) -> LoraConfig:
        assert self.model.lora is not None, "model.full_finetune: no adapter"  # else set by the validator
        return self.model.lora

    @property
    def max_lora_rank(self) -> int:
        """The largest LoRA rank vLLM must serve: the adapter's, or the largest variant's."""
        return max(c.lora.rank for _, c in self.variant_configs()) if self.variants else self.lora.rank

    def variant_configs(self) -> list[tuple[str, RLConfig]]:
        """Each variant's name and effective config: this config with the variant's overrides applied
        and no variants of its own. Computed afresh on each call, so a change to this config (such as
        the launcher's resolved values) reaches every variant. Raises ValueError naming the key at fault."""
        return [(v.name, self._variant_config(i, v)) for i, v in enumerate(self.variants)]

    def _variant_config(self, i: int, variant: VariantConfig) -> RLConfig:
        def merged(section: Section, overrides: dict[str, Any], key: str) -> Any:
            try:
                return type(section).model_validate({**section.model_dump(), **overrides})
            except ValidationError as e:
                err = e.errors()[0]
                where = ".".join([f"variants[{i}].{key}", *map(str, err["loc"])])
                msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
                raise ValueError(f"{where}: {msg}") from None

        cfg = self.model_copy(deep=True, update={"variants": []})
        cfg.model.lora = merged(self.lora, variant.model.lora, "model.lora")
        cfg.trainer.optim = merged(self.trainer.optim, variant.trainer.optim, "trainer.optim")
        cfg.trainer.scheduler = merged(self.trainer.scheduler, variant.trainer.scheduler, "trainer.scheduler")
        cfg.trainer.loss = merged(self.trainer.loss, variant.trainer.loss, "trainer.loss")
        if variant.orchestrator.env is not None:
            cfg.orchestrator.env = variant.orchestrator.env
        return cfg


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
