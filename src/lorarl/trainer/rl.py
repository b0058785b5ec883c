"""The RL trainer loop, top to bottom.

Step N: wait for rollouts/step_N, score every completion token under the current adapter,
take one optimizer step on the importance-weighted policy-gradient loss, and write the adapter
to broadcasts/step_N for the orchestrator to hot-load. broadcasts/step_0 is the starting adapter.
With model.full_finetune every weight trains, and each version is the whole model (broadcast.py).
An empty batch (every group of the step had zero advantage, orchestrator.skip_zero_advantage)
changes no weight: no forward pass, no optimizer step; the schedule advances and the same adapter
is written as version N.
The forward passes take `micro_batch_size` samples each, one per padded row, or with `packing`
(the default) `micro_batch_size` rows of up to `seq_len` tokens, several samples to a row, each
group's shared prompt once (`trainer.share_prompts`, packing.py).
Set-up, resume, the data-parallel forward/backward pass and the optimizer step are the Trainer's
that SFT shares (trainer.py); this loop adds the rollouts, the policy loss and the broadcasts.
A sweep ([[variants]]) runs the same step (`train_step`) for each variant's adapter in turn, all on
one base model (trainer/variants.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from lorarl.config.algorithms import LossBase
from lorarl.config.common import DEFAULT_LOGITS_CHUNK_SIZE
from lorarl.config.run import RLConfig
from lorarl.monitor.metrics import MetricsLogger
from lorarl.rollouts import Rollout, RolloutBatch, policy_lag
from lorarl.trainer.batching import MicroBatch, TrainSample
from lorarl.trainer.broadcast import write_policy
from lorarl.trainer.checkpoint import save_checkpoint
from lorarl.trainer.loss import EVERY_TOKEN, LossNorm, Nucleus, micro_batch_loss
from lorarl.trainer.mismatch import effective_sample_size
from lorarl.trainer.model import (
    TrainedModel,
    apply_lora,
    check_lora_for_rl,
    check_vllm_can_serve,
    enable_gradient_checkpointing,
    load_model,
    peak_memory_gib,
)
from lorarl.trainer.packing import PackedBatch
from lorarl.trainer.policy_gap import PolicyHistory, step_policy_gap
from lorarl.trainer.served_probe import attach_probe
from lorarl.trainer.trainer import Model, PassLoss, Trainer, forward_backward_step
from lorarl.written_files import remove_folder

log = logging.getLogger("lorarl.trainer")


def train(cfg: RLConfig) -> None:
    if cfg.trainer.num_threads is not None:  # e.g. to leave vLLM workers on this machine their cores
        torch.set_num_threads(cfg.trainer.num_threads)
    if cfg.variants:
        from lorarl.trainer.variants import train_variants

        train_variants(cfg)
        return
    trainer = Trainer.set_up(cfg, lambda: rl_model(cfg))
    attach_probe(trainer.model, cfg)  # every version written carries the served-adapter check's probe
    metrics = trainer.metrics_logger("trainer", cfg)
    history = PolicyHistory.for_config(cfg)
    write_starting_adapter(trainer, history)
    for step in range(trainer.start + 1, cfg.max_steps + 1):
        train_step(trainer, cfg, step, metrics, history)
    metrics.close()
    trainer.dp.close()


def write_starting_adapter(trainer: Trainer[Model], history: PolicyHistory | None = None) -> None:
    """The policy the orchestrator starts from: version `start` (0, or the checkpoint's step). Writing
    it, as every adapter and checkpoint, takes every rank (FSDP gathers the weights); rank 0 writes.
    `history`: where the versions are kept for the policy gap split (policy_gap.py), if it runs."""
    write_policy(trainer.model, trainer.run.broadcast(trainer.start))
    if history is not None:
        history.record(trainer.model, trainer.start)
    if trainer.dp.is_main:
        log.info("wrote the starting adapter to %s", trainer.run.broadcast(trainer.start))


def train_step(
    trainer: Trainer[Model], cfg: RLConfig, step: int, metrics: MetricsLogger, history: PolicyHistory | None = None
) -> None:
    """Step `step` of the model's active adapter: wait for its batch, train on it, write the adapter
    (and the checkpoint, when due), log the step. `history`: the adapter's versions, with the policy
    gap split (trainer.policy_gap_interval)."""
    run, dp, model = trainer.run, trainer.dp, trainer.model
    device = dp.device()
    t0 = time.perf_counter()
    batch = wait_for_batch(run.rollouts(step), step, cfg.trainer.batch_timeout)
    t_batch = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    samples = [train_sample(r) for r in batch.rollouts]
    loss_tokens = sum(sum(s.loss_mask) for s in samples)
    nucleus = Nucleus(cfg.orchestrator.sampling.top_p, cfg.orchestrator.sampling.top_k)
    if samples:
        pass_loss = policy_gradient_loss(
            model, samples, cfg.trainer.loss, max(1, loss_tokens), cfg.trainer.logits_chunk_size, nucleus
        )
        step_stats = forward_backward_step(model, samples, pass_loss, trainer.passes, dp)
        step_stats |= effective_sample_size(step_stats)
        loss = step_stats.pop("loss")
        t_backward = time.perf_counter()
        grad_norm, lr = trainer.optimizer_step(step, signal=any(s.advantage != 0 for s in samples))
        trainer.check_weights()  # before the adapter is written (which waits for the device anyway)
        updated_at: float | None = time.time()  # wall clock: the orchestrator compares it with its own
    else:  # nothing to learn from (module docstring), on every rank alike
        step_stats, loss, t_backward = {}, 0.0, time.perf_counter()
        grad_norm, lr = 0.0, trainer.step_without_update()
        updated_at = None
    t_optim = time.perf_counter()

    write_policy(model, run.broadcast(step), updated_at)
    t_broadcast = time.perf_counter()
    ckpt = cfg.trainer.ckpt
    if ckpt.interval is not None and step % ckpt.interval == 0:
        save_checkpoint(run, step, model, trainer.optimizer, trainer.scheduler, {}, ckpt.keep_last)
    t_end = time.perf_counter()
    # After the step's timings: the split is the diagnostics' cost, logged as time/policy_gap.
    gap = step_policy_gap(model, history, cfg, step, batch.rollouts, samples, nucleus) if history is not None else {}

    lags = [policy_lag(step, r.policy_version) for r in batch.rollouts]
    metrics.log(
        step,
        {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            **step_stats,
            **gap,
            **({"policy_lag/mean": sum(lags) / len(lags), "policy_lag/max": max(lags)} if lags else {}),
            "samples": len(samples),
            "skipped_steps": trainer.watch.skipped_steps,
            "tokens": loss_tokens,
            "tokens_per_s": loss_tokens / max(1e-9, t_end - t_batch),
            "memory/peak_gib": peak_memory_gib(device),
            "time/wait_for_batch": t_batch - t0,
            "time/forward_backward": t_backward - t_batch,
            "time/optimizer": t_optim - t_backward,
            "time/broadcast": t_broadcast - t_optim,
            "time/checkpoint": t_end - t_broadcast,
            "time/step": t_end - t0,
        },
    )
    if dp.is_main and not cfg.trainer.keep_rollouts:
        remove_folder(run.rollouts(step))  # trained on: only a resume would need it, and it samples anew
    log.info(
        "%sstep %d: loss %.4f, grad norm %.3f, |logp diff| %.2e, waited %.1f s for the batch",
        f"{run.variant}: " if run.variant else "",
        step,
        loss,
        grad_norm,
        step_stats.get("mismatch/logprob_abs_diff", 0.0),
        t_batch - t0,
    )


def rl_model(cfg: RLConfig) -> TrainedModel:
    """The base model with a LoRA adapter that vLLM can serve (the orchestrator hot-loads every
    version), or with model.full_finetune the model itself, every weight trained."""
    if cfg.model.full_finetune:
        model: TrainedModel = load_model(cfg.model)
    else:
        check_lora_for_rl(cfg.lora)
        model = apply_lora(load_model(cfg.model), cfg.lora)
        check_vllm_can_serve(model)
    if cfg.trainer.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def train_sample(rollout: Rollout) -> TrainSample:
    """Prompt and completion as one sample; loss on the completion tokens the policy sampled."""
    prompt = len(rollout.prompt_ids)
    return TrainSample(
        input_ids=rollout.prompt_ids + rollout.completion_ids,
        loss_mask=[False] * prompt + rollout.completion_mask,
        old_logprobs=[0.0] * prompt + rollout.completion_logprobs,
        advantage=rollout.advantage,
        temperature=rollout.temperature,
    )


def policy_gradient_loss(
    model: TrainedModel,
    samples: Sequence[TrainSample],
    cfg: LossBase,
    loss_tokens: int,
    chunk_size: int = DEFAULT_LOGITS_CHUNK_SIZE,
    nucleus: Nucleus = EVERY_TOKEN,
) -> PassLoss:
    """The policy loss (loss.py) of one forward pass, as its share of the loss of the step's `samples`,
    and its stats: means over the pass's loss tokens weighted by its share of the step's
    `loss_tokens`, so that they add up over the passes of all ranks to the step's means. `nucleus`:
    the tokens vLLM sampled from (top_k, top_p)."""
    # Fixed from the whole step, so that the passes' losses add up to the step's loss.
    norm = LossNorm.for_step(cfg, samples)

    def pass_loss(batch: MicroBatch | PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        loss, stats = micro_batch_loss(model, batch, cfg, norm, chunk_size, nucleus)
        weight = batch.loss_mask.sum().item() / loss_tokens
        return loss, {key: value.item() * weight for key, value in stats.items()}

    return pass_loss


def wait_for_batch(folder: Path, step: int, timeout: float, poll: float = 0.05) -> RolloutBatch:
    """Block until the orchestrator has renamed rollouts/step_N into place."""
    deadline = time.monotonic() + timeout
    while not folder.is_dir():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no rollouts for step {step} at {folder} after {timeout:.0f} s")
        time.sleep(poll)
    return RolloutBatch.read(folder, step)
