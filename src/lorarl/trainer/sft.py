"""The SFT loop, top to bottom: local chat data in, a PEFT adapter (or a full model) out.

A step trains on `batch_size` samples; its loss is the mean negative log-likelihood of their loss
tokens (`data.loss_on`). Gradients accumulate over forward/backward passes of `micro_batch_size`
samples, or with `packing` of `micro_batch_size` packed rows of up to `seq_len` tokens (the same
bound on tokens per pass). Every `eval.interval` steps it measures the loss on held-out data, and
every `ckpt.interval` steps it writes a checkpoint that `--resume` continues from. The result lands
in `<run_dir>/final/`, which an RL config starts from with `model.lora.init_adapter`. With
`parallel.dp` N ranks train on shares of every step (distributed.py); `parallel.fsdp` also shards
the weights over them (fsdp.py), LoRA or full fine-tuning alike. Set-up, resume, the
data-parallel forward/backward pass and the optimizer step are the Trainer's that RL shares
(trainer.py); this loop adds the data order, the NLL loss, evaluation and the result folder.
A run whose update made weights NaN or infinite, or whose gradient stays 0 (too high a learning
rate), stops there (update_watch.py's `TrainingStopped`): no checkpoint, eval or `final/` from them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from transformers import AutoTokenizer

from lorarl.config.common import DEFAULT_LOGITS_CHUNK_SIZE
from lorarl.config.model import ModelConfig
from lorarl.config.sft import SFTConfig
from lorarl.trainer.batching import MicroBatch, TrainSample
from lorarl.trainer.checkpoint import save_checkpoint
from lorarl.trainer.distributed import DataParallel
from lorarl.trainer.fsdp import gathered_weights
from lorarl.trainer.loss import token_logprobs
from lorarl.trainer.model import TrainedModel, apply_lora, load_model, note_quantized_base
from lorarl.trainer.packing import ForwardPasses, PackedBatch
from lorarl.trainer.sft_data import DataOrder, load_sft_data
from lorarl.trainer.trainer import PassLoss, Trainer, forward_backward_step, rank_passes
from lorarl.written_files import record_written

log = logging.getLogger("lorarl.sft")


def train(cfg: SFTConfig) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    data = load_sft_data(cfg.data, tokenizer, cfg.seq_len, cfg.seed)
    log.info(
        "%d training samples, %d eval samples from %s (seq_len %d: %s)",
        len(data.train),
        len(data.eval),
        cfg.data.path,
        cfg.seq_len,
        dict(data.counts) or "none truncated or skipped",
    )
    trainer = Trainer.set_up(cfg, lambda: sft_model(cfg.model), pad_id)
    run, dp, model = trainer.run, trainer.dp, trainer.model
    order = DataOrder(len(data.train), cfg.seed, cfg.data.shuffle)
    if trainer.resumed is not None:
        order.load_state_dict(trainer.resumed["data"])
    metrics = trainer.metrics_logger("sft", cfg)

    progress = Progress(
        TextColumn("sft"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
        TimeRemainingColumn(),
        disable=not metrics.monitor.console,
    )
    eval_info = ""
    with progress:
        task = progress.add_task("sft", total=cfg.max_steps, completed=trainer.start, info="")
        for step in range(trainer.start + 1, cfg.max_steps + 1):
            t0 = time.perf_counter()
            batch = [data.train[i] for i in order.take(cfg.batch_size)]
            totals = forward_backward_step(
                model, batch, mean_nll(model, batch, cfg.logits_chunk_size), trainer.passes, dp
            )
            grad_norm, lr = trainer.optimizer_step(step, signal=totals["loss"] > 0)
            elapsed = time.perf_counter() - t0
            tokens = sum(len(s.input_ids) for s in batch)  # padding excluded
            tokens_per_s = tokens / elapsed

            row: dict[str, float] = {}
            if step % cfg.log_interval == 0 or step == cfg.max_steps:
                row |= {
                    "loss": totals["loss"],
                    "grad_norm": grad_norm,
                    "lr": lr,
                    "tokens_per_s": tokens_per_s,
                    "padding_frac": 1 - tokens / totals["padded_tokens"],
                    "epoch": order.epoch,
                    "skipped_steps": trainer.watch.skipped_steps,
                    "time/step": elapsed,
                }
            if data.eval and (step % cfg.eval.interval == 0 or step == cfg.max_steps):
                trainer.check_weights()
                row["eval/loss"] = evaluate(model, data.eval, cfg.batch_size, trainer.passes, dp, cfg.logits_chunk_size)
                eval_info = f" | eval {row['eval/loss']:.3f}"
            if row:
                metrics.log(step, row)
            if cfg.ckpt.interval is not None and step % cfg.ckpt.interval == 0:
                trainer.check_weights()
                save_checkpoint(
                    run,
                    step,
                    model,
                    trainer.optimizer,
                    trainer.scheduler,
                    {"data": order.state_dict()},
                    cfg.ckpt.keep_last,
                )
            progress.update(task, advance=1, info=f"loss {totals['loss']:.3f}{eval_info} | {tokens_per_s:,.0f} tok/s")

    # Rank 0 alone writes the result: every rank holds the same weights (or with fsdp its shards of
    # them, which every rank gathers for rank 0 to write), never from NaN or infinite ones.
    trainer.check_weights()
    final = run.final
    weights = gathered_weights(model)  # None unless sharded
    if dp.is_main:
        model.save_pretrained(str(final), state_dict=weights)
        note_quantized_base(model, final)
        tokenizer.save_pretrained(final)
        record_written(*(p for p in final.rglob("*") if p.is_file()))  # prepare() left no file of a user's here
        log.info("wrote %s", final)
    metrics.close()
    dp.close()
    return final


def sft_model(cfg: ModelConfig) -> TrainedModel:
    """With [model.lora] a LoRA adapter on the base model, without it the whole model, trained in full.
    Either saves itself with save_pretrained as the result folder."""
    base = load_model(cfg)
    return base if cfg.lora is None else apply_lora(base, cfg.lora)


def mean_nll(
    model: torch.nn.Module, samples: Sequence[TrainSample], chunk_size: int = DEFAULT_LOGITS_CHUNK_SIZE
) -> PassLoss:
    """The step's loss, the mean negative log-likelihood per loss token of `samples`: of one forward
    pass, its share. Counts the pass's tokens, padding included ("padded_tokens")."""
    loss_tokens = count_loss_tokens(samples)  # of the whole step: a global mean

    def pass_loss(batch: MicroBatch | PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return summed_nll(model, batch, chunk_size) / loss_tokens, {"padded_tokens": batch.input_ids.numel()}

    return pass_loss


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    samples: Sequence[TrainSample],
    step_size: int,
    passes: ForwardPasses,
    dp: DataParallel,
    chunk_size: int = DEFAULT_LOGITS_CHUNK_SIZE,
) -> float:
    """Mean negative log-likelihood per loss token of `samples`, packed a step's worth at a time."""
    model.eval()
    total = sum(
        summed_nll(model, batch, chunk_size).item() for batch in rank_passes(model, samples, passes, dp, step_size)
    )
    return dp.sum_values({"nll": total})["nll"] / count_loss_tokens(samples)


def count_loss_tokens(samples: Sequence[TrainSample]) -> int:
    # loss_mask[0] never carries loss: the first token is no model prediction (see MicroBatch).
    return max(1, sum(sum(s.loss_mask[1:]) for s in samples))


def summed_nll(
    model: torch.nn.Module, batch: MicroBatch | PackedBatch, chunk_size: int = DEFAULT_LOGITS_CHUNK_SIZE
) -> torch.Tensor:
    """Negative log-likelihood of the loss tokens of a forward pass (on the model's device), summed."""
    return -(token_logprobs(model, batch, chunk_size) * batch.loss_mask).sum()
