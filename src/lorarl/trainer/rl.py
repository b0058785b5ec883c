"""The RL trainer loop, top to bottom.

Step N: wait for rollouts/step_N, score every completion token under the current adapter,
take one optimizer step on the importance-weighted policy-gradient loss, and write the adapter
to broadcasts/step_N for the orchestrator to hot-load. broadcasts/step_0 is the starting adapter.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from lorarl.config.models import RLConfig
from lorarl.monitor.metrics import MetricsLogger
from lorarl.rollouts import RolloutBatch
from lorarl.run_folder import RunFolder
from lorarl.trainer.batching import TrainSample, micro_batches
from lorarl.trainer.broadcast import write_adapter
from lorarl.trainer.loss import policy_loss, token_logprobs
from lorarl.trainer.model import apply_lora, load_model, parameter_summary
from lorarl.trainer.optim import build_optimizer, build_scheduler

log = logging.getLogger("lorarl.trainer")


def train(cfg: RLConfig) -> None:
    run = RunFolder(cfg.run_dir).create()
    metrics = MetricsLogger(run.metrics, "trainer", cfg.monitor, cfg.run_name)
    torch.manual_seed(cfg.seed)
    if cfg.trainer.num_threads is not None:
        torch.set_num_threads(cfg.trainer.num_threads)

    model = apply_lora(load_model(cfg.model), cfg.lora)
    pad_id = model.config.pad_token_id or 0
    summary = parameter_summary(model)
    log.info(
        "LoRA rank %d on %s: %d trainable of %d parameters (%.1f%%), adapter %.2f MB",
        cfg.lora.rank, cfg.lora.target_modules, summary["params/trainable"], summary["params/total"],
        100 * summary["params/trainable"] / summary["params/total"], summary["params/trainable_bytes"] / 1e6,
    )  # fmt: skip
    optimizer = build_optimizer(model, cfg.trainer.optim)
    scheduler = build_scheduler(optimizer, cfg.trainer.scheduler, cfg.max_steps)

    write_adapter(model, run.broadcast(0))
    log.info("wrote the starting adapter to %s", run.broadcast(0))

    for step in range(1, cfg.max_steps + 1):
        t0 = time.perf_counter()
        batch = wait_for_batch(run.rollouts(step), step, cfg.trainer.batch_timeout)
        t_batch = time.perf_counter()

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
        model.train()
        step_stats: dict[str, float] = {}
        loss_sum = 0.0
        for mb in micro_batches(samples, cfg.trainer.micro_batch_size, pad_id):
            loss, stats = policy_loss(token_logprobs(model, mb), mb, cfg.trainer.loss, total_loss_tokens)
            loss.backward()
            loss_sum += loss.item()
            # Token-weighted average of the per-micro-batch stats.
            weight = mb.loss_mask.sum().item() / total_loss_tokens
            for k, v in stats.items():
                step_stats[k] = step_stats.get(k, 0.0) + v.item() * weight
        t_backward = time.perf_counter()

        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in model.parameters() if p.requires_grad], cfg.trainer.optim.max_norm
        )
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        t_optim = time.perf_counter()

        write_adapter(model, run.broadcast(step))
        t_end = time.perf_counter()

        lags = [step - 1 - r.policy_version for r in batch.rollouts]
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
                "time/wait_for_batch": t_batch - t0,
                "time/forward_backward": t_backward - t_batch,
                "time/optimizer": t_optim - t_backward,
                "time/broadcast": t_end - t_optim,
                "time/step": t_end - t0,
            },
        )
        log.info(
            "step %d: loss %.4f, grad norm %.3f, |logp diff| %.2e, waited %.1f s for the batch",
            step, loss_sum, grad_norm.item(), step_stats.get("mismatch/logprob_abs_diff", 0.0), t_batch - t0,
        )  # fmt: skip
    metrics.close()


def wait_for_batch(folder: Path, step: int, timeout: float, poll: float = 0.05) -> RolloutBatch:
    """Block until the orchestrator has renamed rollouts/step_N into place."""
    deadline = time.monotonic() + timeout
    while not folder.is_dir():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no rollouts for step {step} at {folder} after {timeout:.0f} s")
        time.sleep(poll)
    return RolloutBatch.read(folder, step)
