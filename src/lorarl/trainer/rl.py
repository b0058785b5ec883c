"""The RL trainer loop, top to bottom.

Step N: wait for rollouts/step_N, score every completion token under the current adapter,
take one optimizer step on the importance-weighted policy-gradient loss, and write the adapter
to broadcasts/step_N for the orchestrator to hot-load. broadcasts/step_0 is the starting adapter.
The forward passes take `micro_batch_size` samples each, one per padded row, or with `packing`
(the default) `micro_batch_size` rows of up to `seq_len` tokens, several samples to a row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import peft
import torch

from lorarl.config.models import MonitorConfig, RLConfig
from lorarl.monitor.metrics import MetricsLogger
from lorarl.rollouts import RolloutBatch, policy_lag
from lorarl.run_folder import RunFolder
from lorarl.trainer.batching import TrainSample
from lorarl.trainer.broadcast import write_adapter
from lorarl.trainer.checkpoint import (
    discard_after,
    find_checkpoint,
    load_training_state,
    load_weights,
    save_checkpoint,
)
from lorarl.trainer.distributed import DataParallel, init_data_parallel
from lorarl.trainer.loss import LossNorm, micro_batch_loss
from lorarl.trainer.model import (
    apply_lora,
    check_vllm_can_serve,
    enable_gradient_checkpointing,
    load_model,
    parameter_summary,
    peak_memory_gib,
)
from lorarl.trainer.optim import build_optimizer, build_scheduler
from lorarl.trainer.packing import ForwardPasses

log = logging.getLogger("lorarl.trainer")


def train(cfg: RLConfig) -> None:
    dp = init_data_parallel(cfg.trainer.parallel)
    run = RunFolder(cfg.run_dir).create()
    # Rank 0 alone logs, broadcasts and checkpoints: every rank holds the same adapter.
    monitor = cfg.monitor if dp.is_main else MonitorConfig(jsonl=False, console=False)
    metrics = MetricsLogger(run.metrics, "trainer", monitor, cfg.run_name)
    torch.manual_seed(cfg.seed)
    if cfg.trainer.num_threads is not None:
        torch.set_num_threads(cfg.trainer.num_threads)

    cfg.lora.check_for_rl()
    device = dp.device()
    model = apply_lora(load_model(cfg.model), cfg.lora)
    check_vllm_can_serve(model)
    if cfg.trainer.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    dp.sync_parameters([p for p in model.parameters() if p.requires_grad])
    pad_id = model.config.pad_token_id or 0
    summary = parameter_summary(model)
    log.info(
        "LoRA rank %d on %s: %d trainable of %d parameters (%.1f%%), adapter %.2f MB",
        cfg.lora.rank, cfg.lora.target_modules, summary["params/trainable"], summary["params/total"],
        100 * summary["params/trainable"] / summary["params/total"], summary["params/trainable_bytes"] / 1e6,
    )  # fmt: skip
    resume = find_checkpoint(run, cfg.resume.step) if cfg.resume is not None else None
    if resume is not None:
        load_weights(resume, model)  # into the whole model, before FSDP shards it
    dp.place(model)
    trainable = [p for p in model.parameters() if p.requires_grad]  # after `place`: FSDP made new ones
    optimizer = build_optimizer(model, cfg.trainer.optim)
    scheduler = build_scheduler(optimizer, cfg.trainer.scheduler, cfg.max_steps)

    start = 0
    if resume is not None:
        start = load_training_state(resume, model, optimizer, scheduler)["step"]
        if dp.is_main:
            discard_after(run, start)
    # The policy the orchestrator starts from: version `start` (0, or the checkpoint's step). Writing
    # it, as every adapter and checkpoint, takes every rank (FSDP gathers the weights); rank 0 writes.
    write_adapter(model, run.broadcast(start))
    if dp.is_main:
        log.info("wrote the starting adapter to %s", run.broadcast(start))

    for step in range(start + 1, cfg.max_steps + 1):
        t0 = time.perf_counter()
        batch = wait_for_batch(run.rollouts(step), step, cfg.trainer.batch_timeout)
        t_batch = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        samples = [
            TrainSample(
                input_ids=r.prompt_ids + r.completion_ids,
                loss_mask=[False] * len(r.prompt_ids) + r.completion_mask,
                old_logprobs=[0.0] * len(r.prompt_ids) + r.completion_logprobs,
                advantage=r.advantage,
                temperature=r.temperature,
            )
            for r in batch.rollouts
        ]
        total_loss_tokens = max(1, sum(sum(r.completion_mask) for r in batch.rollouts))
        # Fixed from the whole batch, so that the micro-batch losses add up to the step's loss.
        norm = LossNorm.for_step(cfg.trainer.loss, samples)
        model.train()
        step_stats = forward_backward(model, dp.shard(samples), cfg, norm, total_loss_tokens, pad_id, device, dp)
        dp.sum_gradients(trainable)
        step_stats = dp.sum_values(step_stats)
        loss_sum = step_stats.pop("loss")
        t_backward = time.perf_counter()

        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.trainer.optim.max_norm)
        lr = float(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        t_optim = time.perf_counter()

        write_adapter(model, run.broadcast(step))
        t_broadcast = time.perf_counter()
        ckpt = cfg.trainer.ckpt
        if ckpt.interval is not None and step % ckpt.interval == 0:
            save_checkpoint(run, step, model, optimizer, scheduler, {}, ckpt.keep_last)
        t_end = time.perf_counter()

        lags = [policy_lag(step, r.policy_version) for r in batch.rollouts]
        metrics.log(
            step,
            {
                "loss": loss_sum,
                "grad_norm": grad_norm.item(),
                "lr": lr,
                **step_stats,
                "policy_lag/mean": sum(lags) / len(lags),
                "policy_lag/max": max(lags),
                "tokens": total_loss_tokens,
                "tokens_per_s": total_loss_tokens / max(1e-9, t_end - t_batch),
                "memory/peak_gib": peak_memory_gib(device),
                "time/wait_for_batch": t_batch - t0,
                "time/forward_backward": t_backward - t_batch,
                "time/optimizer": t_optim - t_backward,
                "time/broadcast": t_broadcast - t_optim,
                "time/checkpoint": t_end - t_broadcast,
                "time/step": t_end - t0,
            },
        )
        log.info(
            "step %d: loss %.4f, grad norm %.3f, |logp diff| %.2e, waited %.1f s for the batch",
            step, loss_sum, grad_norm.item(), step_stats.get("mismatch/logprob_abs_diff", 0.0), t_batch - t0,
        )  # fmt: skip
    metrics.close()
    dp.close()


def forward_backward(
    model: peft.PeftModel,
    samples: Sequence[TrainSample],
    cfg: RLConfig,
    norm: LossNorm,
    total_loss_tokens: int,
    pad_id: int,
    device: torch.device,
    dp: DataParallel | None = None,
) -> dict[str, float]:
    """Accumulate the gradient of these samples' share of the step loss, one forward batch at a time.
    Returns that share of the loss ("loss") and of each stat: the stats are means over loss tokens,
    weighted by the batch's share of the step's `total_loss_tokens`, so that the shares of all
    batches (and ranks) add up to the step's mean. `dp` (with fsdp) adds passes without loss tokens
    until every rank is done."""
    shares: dict[str, float] = {"loss": 0.0}
    passes = forward_passes(cfg, pad_id)
    for mb in (dp or DataParallel()).same_passes(passes.split(samples), passes.without_loss()):
        loss, stats = micro_batch_loss(model, mb.to(device), cfg.trainer.loss, norm)
        loss.backward()
        shares["loss"] += loss.item()
        weight = mb.loss_mask.sum().item() / total_loss_tokens
        for k, v in stats.items():
            shares[k] = shares.get(k, 0.0) + v.item() * weight
    return shares


def forward_passes(cfg: RLConfig, pad_id: int) -> ForwardPasses:
    return ForwardPasses(cfg.trainer.packing, cfg.seq_len, cfg.trainer.micro_batch_size, pad_id)


def wait_for_batch(folder: Path, step: int, timeout: float, poll: float = 0.05) -> RolloutBatch:
    """Block until the orchestrator has renamed rollouts/step_N into place."""
    deadline = time.monotonic() + timeout
    while not folder.is_dir():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no rollouts for step {step} at {folder} after {timeout:.0f} s")
        time.sleep(poll)
    return RolloutBatch.read(folder, step)
