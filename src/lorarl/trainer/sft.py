"""The SFT loop, top to bottom: chat JSONL in, a PEFT adapter (or a full model) out.

Loss on assistant tokens only. The result lands in `<run_dir>/final/`, which an RL config starts
from with `model.lora.init_adapter = "<run_dir>/final"`.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from transformers import AutoTokenizer

from lorarl.config.models import SFTConfig
from lorarl.monitor.metrics import MetricsLogger
from lorarl.run_folder import RunFolder
from lorarl.trainer.batching import TrainSample, micro_batches
from lorarl.trainer.chat import tokenize_with_assistant_mask
from lorarl.trainer.loss import token_logprobs
from lorarl.trainer.model import apply_lora, load_model, parameter_summary
from lorarl.trainer.optim import build_optimizer, build_scheduler

log = logging.getLogger("lorarl.sft")


def load_chat_jsonl(path: Path) -> list[list[dict[str, str]]]:
    conversations = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                messages = record["messages"]
                if not isinstance(messages, list) or not all("role" in m and "content" in m for m in messages):
                    raise ValueError("'messages' must be a list of {role, content}")
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: malformed record: {e}") from None
            conversations.append(messages)
    if not conversations:
        raise ValueError(f"{path}: no records")
    return conversations


def train(cfg: SFTConfig) -> Path:
    run = RunFolder(cfg.run_dir).create()
    metrics = MetricsLogger(run.metrics, "sft", cfg.monitor, cfg.run_name)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name)
    samples = []
    truncated = 0
    for messages in load_chat_jsonl(cfg.data.path):
        ids, mask = tokenize_with_assistant_mask(tokenizer, messages)
        truncated += len(ids) > cfg.seq_len
        samples.append(TrainSample(ids[: cfg.seq_len], mask[: cfg.seq_len]))
    log.info("%d conversations from %s (%d truncated to seq_len %d)", len(samples), cfg.data.path,
             truncated, cfg.seq_len)  # fmt: skip

    model = load_model(cfg.model)
    if cfg.model.lora is not None:
        model = apply_lora(model, cfg.model.lora)
    summary = parameter_summary(model)
    log.info("training %d of %d parameters (%s)", summary["params/trainable"], summary["params/total"],
             "LoRA" if cfg.model.lora else "full")  # fmt: skip
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.scheduler, cfg.max_steps)

    order: list[int] = []
    progress = Progress(
        TextColumn("sft"), BarColumn(), TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
        TimeRemainingColumn(), disable=not cfg.monitor.console,
    )  # fmt: skip
    with progress:
        task = progress.add_task("sft", total=cfg.max_steps, info="")
        for step in range(1, cfg.max_steps + 1):
            t0 = time.perf_counter()
            batch = []
            for _ in range(cfg.batch_size):
                if not order:  # a new epoch
                    order = list(range(len(samples)))
                    if cfg.data.shuffle:
                        rng.shuffle(order)
                batch.append(samples[order.pop()])
            total_tokens = max(1, sum(sum(s.loss_mask[1:]) for s in batch))
            model.train()
            loss_sum = 0.0
            for mb in micro_batches(batch, cfg.micro_batch_size, pad_id):
                loss = -(token_logprobs(model, mb) * mb.loss_mask).sum() / total_tokens
                loss.backward()
                loss_sum += loss.item()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], cfg.optim.max_norm
            )
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - t0
            tokens_per_s = sum(len(s.input_ids) for s in batch) / elapsed
            if step % cfg.log_interval == 0 or step == cfg.max_steps:
                metrics.log(step, {"loss": loss_sum, "grad_norm": grad_norm.item(), "lr": lr,
                                   "tokens_per_s": tokens_per_s, "time/step": elapsed})  # fmt: skip
            progress.update(task, advance=1, info=f"loss {loss_sum:.3f} | {tokens_per_s:,.0f} tok/s")

    final = run.root / "final"
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    metrics.close()
    log.info("wrote %s", final)
    return final
