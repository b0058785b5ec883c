"""The SFT loop, top to bottom: local chat data in, a PEFT adapter (or a full model) out.

A step trains on `batch_size` samples; its loss is the mean negative log-likelihood of their loss
tokens (`data.loss_on`). Gradients accumulate over forward/backward passes of `micro_batch_size`
samples, or with `packing` of `micro_batch_size` packed rows of up to `seq_len` tokens (the same
bound on tokens per pass). Every `eval.interval` steps it measures the loss on held-out data, and
every `ckpt.interval` steps it writes a checkpoint that `--resume` continues from. The result lands
in `<run_dir>/final/`, which an RL config starts from with `model.lora.init_adapter`. With
`parallel.dp` N ranks train on shares of every step (distributed.py); `parallel.fsdp` also shards
the weights over them (fsdp.py), LoRA or full fine-tuning alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from transformers import AutoTokenizer, PreTrainedModel

from lorarl.config.models import MonitorConfig, SFTConfig
from lorarl.monitor.metrics import MetricsLogger
from lorarl.run_folder import RunFolder
from lorarl.trainer.batching import MicroBatch, TrainSample
from lorarl.trainer.checkpoint import (
    discard_after,
    find_checkpoint,
    load_training_state,
    load_weights,
    save_checkpoint,
)
from lorarl.trainer.distributed import DataParallel, init_data_parallel
from lorarl.trainer.fsdp import gathered_weights
from lorarl.trainer.loss import token_logprobs
from lorarl.trainer.model import apply_lora, load_model, parameter_summary
from lorarl.trainer.optim import build_optimizer, build_scheduler
from lorarl.trainer.packing import ForwardPasses, PackedBatch, packed_token_logprobs
from lorarl.trainer.sft_data import DataOrder, load_sft_data

log = logging.getLogger("lorarl.sft")


def train(cfg: SFTConfig) -> Path:
    dp = init_data_parallel(cfg.parallel)
    run = RunFolder(cfg.run_dir).create()
    torch.manual_seed(cfg.seed)

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    data = load_sft_data(cfg.data, tokenizer, cfg.seq_len, cfg.seed)
    log.info("%d training samples, %d eval samples from %s (seq_len %d: %s)", len(data.train), len(data.eval),
             cfg.data.path, cfg.seq_len, dict(data.counts) or "none truncated or skipped")  # fmt: skip

    base = load_model(cfg.model)
    # Both save_pretrained as the result folder: a PEFT adapter, or a whole model for full fine-tuning.
    model: PreTrainedModel | PeftModel = base if cfg.model.lora is None else apply_lora(base, cfg.model.lora)
    dp.sync_parameters([p for p in model.parameters() if p.requires_grad])
    summary = parameter_summary(model)
    log.info("training %d of %d parameters (%s)", summary["params/trainable"], summary["params/total"],
             "LoRA" if cfg.model.lora else "full")  # fmt: skip
    resume = find_checkpoint(run, cfg.resume.step) if cfg.resume is not None else None
    if resume is not None:
        load_weights(resume, model)  # into the whole model, before FSDP shards it
    dp.place(model)
    trainable = [p for p in model.parameters() if p.requires_grad]  # after `place`: FSDP made new ones
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.scheduler, cfg.max_steps)
    order = DataOrder(len(data.train), cfg.seed, cfg.data.shuffle)

    start = 0
    if resume is not None:
        state = load_training_state(resume, model, optimizer, scheduler)
        start = state["step"]
        order.load_state_dict(state["data"])
        if dp.is_main:
            discard_after(run, start)
    # Rank 0 alone logs and writes checkpoints and the result: every rank holds the same weights (or
    # with fsdp its shards of them, which every rank gathers for rank 0 to write).
    monitor = cfg.monitor if dp.is_main else MonitorConfig(jsonl=False, console=False)
    metrics = MetricsLogger(run.metrics, "sft", monitor, cfg.run_name)

    progress = Progress(
        TextColumn("sft"), BarColumn(), TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
        TimeRemainingColumn(), disable=not monitor.console,
    )  # fmt: skip
    eval_info = ""
    with progress:
        task = progress.add_task("sft", total=cfg.max_steps, completed=start, info="")
        for step in range(start + 1, cfg.max_steps + 1):
            t0 = time.perf_counter()
            batch = [data.train[i] for i in order.take(cfg.batch_size)]
            model.train()
            stats = forward_backward(model, batch, cfg, pad_id, dp)
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.max_norm)
            lr = float(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - t0
            tokens_per_s = stats.tokens / elapsed

            row: dict[str, float] = {}
            if step % cfg.log_interval == 0 or step == cfg.max_steps:
                row |= {"loss": stats.loss, "grad_norm": grad_norm.item(), "lr": lr, "tokens_per_s": tokens_per_s,
                        "padding_frac": 1 - stats.tokens / stats.padded_tokens, "epoch": order.epoch,
                        "time/step": elapsed}  # fmt: skip
            if data.eval and (step % cfg.eval.interval == 0 or step == cfg.max_steps):
                row["eval/loss"] = evaluate(model, data.eval, cfg, pad_id, dp)
                eval_info = f" | eval {row['eval/loss']:.3f}"
            if row:
                metrics.log(step, row)
            if cfg.ckpt.interval is not None and step % cfg.ckpt.interval == 0:
                save_checkpoint(run, step, model, optimizer, scheduler, {"data": order.state_dict()},
                                cfg.ckpt.keep_last)  # fmt: skip
            progress.update(task, advance=1, info=f"loss {stats.loss:.3f}{eval_info} | {tokens_per_s:,.0f} tok/s")

    final = run.final
    weights = gathered_weights(model)  # None unless sharded
    if dp.is_main:
        model.save_pretrained(str(final), state_dict=weights)
        tokenizer.save_pretrained(final)
        log.info("wrote %s", final)
    metrics.close()
    dp.close()
    return final


@dataclass
class StepStats:
    loss: float  # mean negative log-likelihood per loss token
    tokens: int  # sample tokens, padding excluded
    padded_tokens: int  # tokens of the forward passes, padding included


def forward_backward(
    model: torch.nn.Module, batch: Sequence[TrainSample], cfg: SFTConfig, pad_id: int, dp: DataParallel
) -> StepStats:
    """Accumulate the gradient of the step's loss over this rank's micro-batches, summed over ranks."""
    loss_tokens = max(1, sum(sum(s.loss_mask[1:]) for s in batch))  # of the whole batch: a global mean
    loss_sum = 0.0
    padded = 0
    passes = forward_passes(cfg, pad_id)
    for mb in dp.same_passes(passes.split(dp.shard(list(batch))), passes.without_loss()):
        loss = summed_nll(model, mb) / loss_tokens
        loss.backward()
        loss_sum += loss.item()
        padded += mb.input_ids.numel()
    dp.sum_gradients([p for p in model.parameters() if p.requires_grad])
    totals = dp.sum_values({"loss": loss_sum, "padded": padded})
    return StepStats(totals["loss"], sum(len(s.input_ids) for s in batch), int(totals["padded"]))


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, samples: Sequence[TrainSample], cfg: SFTConfig, pad_id: int, dp: DataParallel
) -> float:
    """Mean negative log-likelihood per loss token of `samples`, packed a step's worth at a time
    (packing many thousands of samples at once would take longer than scoring them)."""
    model.eval()
    mine = dp.shard(list(samples))
    passes = forward_passes(cfg, pad_id)
    batches = (mb for i in range(0, len(mine), cfg.batch_size) for mb in passes.split(mine[i : i + cfg.batch_size]))
    total = sum(summed_nll(model, mb).item() for mb in dp.same_passes(batches, passes.without_loss()))
    return dp.sum_values({"nll": total})["nll"] / max(1, sum(sum(s.loss_mask[1:]) for s in samples))


def forward_passes(cfg: SFTConfig, pad_id: int) -> ForwardPasses:
    return ForwardPasses(cfg.packing, cfg.seq_len, cfg.micro_batch_size, pad_id)


def summed_nll(model: torch.nn.Module, mb: MicroBatch | PackedBatch) -> torch.Tensor:
    """Negative log-likelihood of the micro-batch's loss tokens, summed."""
    device = next(model.parameters()).device
    logprobs = packed_token_logprobs(model, mb) if isinstance(mb, PackedBatch) else token_logprobs(model, mb.to(device))
    return -(logprobs * mb.loss_mask.to(device)).sum()
