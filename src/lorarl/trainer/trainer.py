"""What the RL (rl.py) and SFT (sft.py) trainers do alike, in one place, so that the two loops hold
only what differs: where a step's samples come from, its loss, and what is written after it.

* `Trainer.set_up` brings a run to the step it starts from, in the one order that works: data
  parallel and the seed first; the model with its LoRA adapter, every rank on rank 0's weights; a
  checkpoint's weights into the whole model, before FSDP shards it (`DataParallel.place`); the
  optimizer on the parameters that placing leaves; then the checkpoint's optimizer, scheduler and
  RNG states, and what the run wrote after that checkpoint discarded.
* `forward_backward_step` is the one contract of who shards and who sums. A loop hands it all of a
  step's samples (every rank reads them all, so loss denominators are global) and the loss of one
  forward pass; it trains this rank on its share, in as many passes as every other rank makes, and
  sums gradients and stats over the ranks, so that every rank ends the step with the same numbers.
* `Trainer.optimizer_step` clips the gradient, steps, and returns the gradient norm and the lr. Its
  `UpdateWatch` (update_watch.py) skips a non-finite gradient and stops the run where training has
  gone wrong beyond repair (NaN weights, a gradient stuck at 0); `Trainer.check_weights` before
  anything reads the weights out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from lorarl.config.run import MonitorConfig, RLConfig
from lorarl.config.sft import SFTConfig
from lorarl.config.trainer import TrainerConfig
from lorarl.cpu.host_memory import set_host_malloc
from lorarl.monitor.metrics import MetricsLogger
from lorarl.run_folder import RunFolder
from lorarl.trainer.batching import MicroBatch, TrainSample
from lorarl.trainer.checkpoint import find_checkpoint, load_training_state, load_weights
from lorarl.trainer.distributed import DataParallel, init_data_parallel
from lorarl.trainer.model import TrainedModel, parameter_summary, trainable_parameters
from lorarl.trainer.optim import build_optimizer, build_scheduler
from lorarl.trainer.packing import ForwardPasses, PackedBatch, sees_shared_prompts
from lorarl.trainer.update_watch import UpdateWatch, largest_weight

log = logging.getLogger("lorarl.trainer")

PassLoss = Callable[[MicroBatch | PackedBatch], tuple[torch.Tensor, dict[str, float]]]
"""A loop's loss of one forward pass (given on the model's device): the pass's share of the step's
loss, and stats that add up over the step's passes and ranks to the step's values."""


# The model a loop trains: a PEFT adapter on the base model, or the whole model (SFT without [model.lora]).
Model = TypeVar("Model", bound=TrainedModel)


@dataclass
class Trainer(Generic[Model]):
    """A model ready to train from step `start + 1`, with its optimizer and schedule."""

    run: RunFolder
    dp: DataParallel
    model: Model
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    passes: ForwardPasses
    max_norm: float
    # The resumed checkpoint's state.json ({"step": N, ...what the loop saved beside it}), or None.
    resumed: dict[str, Any] | None
    watch: UpdateWatch  # non-finite gradients and weights, gradients stuck at 0 (update_watch.py)

    @property
    def start(self) -> int:
        """The last step done: 0, or the resumed checkpoint's."""
        return 0 if self.resumed is None else int(self.resumed["step"])

    @classmethod
    def set_up(
        cls, cfg: RLConfig | SFTConfig, build_model: Callable[[], Model], pad_id: int | None = None
    ) -> Trainer[Model]:
        """Everything before the first step (module docstring), on every rank. `build_model` loads the
        loop's model, once the seed is set (a fresh LoRA is random). `pad_id`: the tokenizer's padding
        token; None: the model config's (the RL trainer loads no tokenizer)."""
        training = training_section(cfg)
        dp = init_data_parallel(training.parallel)
        set_host_malloc(dp.device().type == "cpu", cfg.keep_freed_memory)
        run = RunFolder(cfg.run_dir).create()
        torch.manual_seed(cfg.seed)
        model = build_model()
        log_parameters(model, cfg)
        dp.sync_parameters(trainable_parameters(model))
        if pad_id is None:
            pad_id = model.config.pad_token_id or 0
        checkpoint = find_checkpoint(run, cfg.resume.step) if cfg.resume is not None else None
        if checkpoint is not None:
            load_weights(checkpoint, model)  # into the whole model, before FSDP shards it
        dp.place(model)
        return cls.on_placed_model(cfg, run, dp, model, checkpoint, pad_id)

    @classmethod
    def on_placed_model(
        cls,
        cfg: RLConfig | SFTConfig,
        run: RunFolder,
        dp: DataParallel,
        model: Model,
        checkpoint: Path | None,
        pad_id: int,
    ) -> Trainer[Model]:
        """The second half of `set_up`, once the model is placed (and holds `checkpoint`'s weights): an
        optimizer over the parameters that require grad now, the schedule, the checkpoint's training
        state. With several adapters on one model (trainer/variants.py), each gets its own, built while
        it alone is trainable."""
        training = training_section(cfg)
        optimizer = build_optimizer(model, training.optim)  # after `place`: FSDP made new parameters
        scheduler = build_scheduler(optimizer, training.scheduler, cfg.max_steps)
        resumed = None
        if checkpoint is not None:
            resumed = load_training_state(checkpoint, model, optimizer, scheduler)
        passes = forward_passes(cfg, pad_id)
        optim = training.optim
        watch = UpdateWatch(optim.max_skipped_steps, "trainer.optim" if isinstance(cfg, RLConfig) else "optim")
        return cls(run, dp, model, optimizer, scheduler, passes, optim.max_norm, resumed, watch)

    def metrics_logger(self, component: str, cfg: RLConfig | SFTConfig) -> MetricsLogger:
        # Rank 0 alone logs: every rank holds the same weights (with fsdp, its shards of them).
        monitor = cfg.monitor if self.dp.is_main else MonitorConfig(jsonl=False, console=False)
        return MetricsLogger(self.run.metrics, component, monitor, cfg.run_name, self.run.variant)

    def optimizer_step(self, step: int, signal: bool = True) -> tuple[float, float]:
        """Clip step `step`'s gradient, step the optimizer and the schedule, clear the gradient. Returns
        the gradient norm before clipping and the learning rate of this step. `signal`: the step had
        something to learn from (a loss above 0, advantages not all 0).

        A gradient that is NaN or infinite changes no weight: the step is skipped, the schedule still
        advances (so steps keep their learning rates); `self.watch` counts it and stops the run as
        update_watch.py says. Every rank sees the same numbers, so all skip or stop together."""
        params = trainable_parameters(self.model)
        grad_norm = self.watch.read_with_last_update(torch.nn.utils.clip_grad_norm_(params, self.max_norm))
        lr = float(self.scheduler.get_last_lr()[0])
        if self.watch.finite_gradient(step, grad_norm, lr):
            self.optimizer.step()
            self.watch.updated(step, lr, largest_weight(params, self.dp), grad_norm, signal)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, lr

    def check_weights(self) -> None:
        """Stop the run if the last update made a weight NaN or infinite. Call it before anything reads
        the weights out (an adapter, a checkpoint, the eval loss, the result), which waits for the
        device anyway; `optimizer_step` checks the update before with the gradient norm it reads."""
        self.watch.check_weights()

    def step_without_update(self) -> float:
        """A step with nothing to learn from: no weight changes, the schedule advances (so later steps
        keep their learning rates). Returns this step's learning rate."""
        lr = float(self.scheduler.get_last_lr()[0])
        self.scheduler.step()
        return lr


def training_section(cfg: RLConfig | SFTConfig) -> TrainerConfig | SFTConfig:
    """Where a config keeps parallel, optim, scheduler, ckpt, packing and micro_batch_size: RL under
    [trainer], SFT at the top level."""
    return cfg.trainer if isinstance(cfg, RLConfig) else cfg


def log_parameters(model: torch.nn.Module, cfg: RLConfig | SFTConfig) -> None:
    """How much of the model trains, and how: a LoRA adapter or the whole model."""
    summary = parameter_summary(model)
    lora = cfg.model.lora
    log.info(
        "training %d of %d parameters (%.1f%%, %.2f MB): %s",
        summary["params/trainable"],
        summary["params/total"],
        100 * summary["params/trainable"] / summary["params/total"],
        summary["params/trainable_bytes"] / 1e6,
        "the whole model" if lora is None else f"LoRA rank {lora.rank} on {lora.target_modules}",
    )


def forward_passes(cfg: RLConfig | SFTConfig, pad_id: int) -> ForwardPasses:
    training = training_section(cfg)
    # RL's groups share prompts; SFT's examples rarely do.
    share = isinstance(cfg, RLConfig) and cfg.trainer.share_prompts
    share = share and sees_shared_prompts(cfg.model.attn_implementation)
    return ForwardPasses(training.packing, cfg.seq_len, training.micro_batch_size, pad_id, share)


def forward_backward_step(
    model: torch.nn.Module,
    samples: Sequence[TrainSample],
    pass_loss: PassLoss,
    passes: ForwardPasses,
    dp: DataParallel | None = None,
) -> dict[str, float]:
    """Accumulate the gradient of a step's loss, summed over ranks. `samples` are all of the step's,
    the same on every rank; this rank takes its share of them (`rank_passes`). Returns the sum over
    passes and ranks of the passes' losses ("loss": the step's loss) and of each stat of `pass_loss`.
    Without `dp`: one process."""
    dp = dp or DataParallel()
    model.train()
    totals = {"loss": 0.0}
    for batch in rank_passes(model, samples, passes, dp):
        loss, stats = pass_loss(batch)
        loss.backward()
        for key, value in {"loss": loss.item(), **stats}.items():
            totals[key] = totals.get(key, 0.0) + value
    dp.sum_gradients(trainable_parameters(model))
    return dp.sum_values(totals)


def rank_passes(
    model: torch.nn.Module,
    samples: Sequence[TrainSample],
    passes: ForwardPasses,
    dp: DataParallel,
    split_at_most: int | None = None,
) -> Iterator[MicroBatch | PackedBatch]:
    """This rank's share of `samples` in forward passes on the model's device, then passes without
    loss tokens until every rank has run out (`DataParallel.same_passes`). `split_at_most`: split
    that many samples into passes at a time (packing many thousands at once would take longer than
    scoring them); None: all at once."""
    mine = dp.shard(list(samples))
    size = split_at_most or max(1, len(mine))
    batches = (batch for i in range(0, len(mine), size) for batch in passes.split(mine[i : i + size]))
    device = next(model.parameters()).device
    return (batch.to(device) for batch in dp.same_passes(batches, passes.without_loss()))
