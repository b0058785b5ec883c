"""The memory plan's trainer estimate (lorarl/launcher/memory_plan.py) against peaks measured on the CPU.

For each configuration of the grid (model shape x seq_len x LoRA / full fine-tuning, with and without
gradient checkpointing) a fresh subprocess builds a random Qwen3 model (lorarl.tiny_model) in
float32, its adapter (rank 8 on the 7 projections) or not, AdamW with its moments already allocated,
and takes one `rl` trainer step on one packed row of seq_len tokens (the trainer's own code: packing,
the chunked policy loss with its entropy, forward/backward, optimizer step).

Measured is the peak of live tensor memory, what the plan estimates and what a GPU run reports
(torch.cuda.max_memory_allocated): the parameters and optimizer state held before the step, plus
the most bytes of tensors allocated during it that were alive at once (`TensorPeak`). The process's
peak resident size above torch's own is printed beside it, as a cross-check only: the CPU's peak
(ru_maxrss) cannot be reset (hence one process per configuration), includes the allocator's and
oneDNN's own buffers, and on a shared machine moves by tenths of a GiB between runs of the same
configuration (0.10-0.19 GiB for one measuring 0.19 GiB of tensors). Prints the table of
docs/memory_plan.md:

    flock /tmp/lorarl-heavy.lock .venv/bin/python scripts/validate_memory_plan.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import weakref
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# name: (hidden size, layers, head_dim, vocabulary)
SHAPES = {
    "h256-L4-v259": (256, 4, 32, 259),
    "h512-L8-v259": (512, 8, 64, 259),
    "h256-L2-v151936": (256, 2, 32, 151936),
}
SEQ_LENS = (1024, 4096, 8192)
# glibc's malloc keeps freed blocks below its dynamic mmap threshold (up to 32 MiB) in its heap, so the
# resident size would count fragmentation, not the live tensors: a fixed threshold returns each freed
# tensor of 128 KiB or more to the system, as a GPU's caching allocator can reuse it.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
TOLERANCE = 0.25


@dataclass(frozen=True)
class Case:
    shape: str
    seq_len: int
    lora: bool
    checkpointing: bool
    dtype: str = "float32"

    def label(self) -> str:
        trained = "LoRA" if self.lora else "full"
        return f"{self.shape} {self.dtype} seq {self.seq_len} {trained}{' ckpt' if self.checkpointing else ''}"


@dataclass(frozen=True)
class Result:
    case: Case
    measured_gib: float  # peak live tensors
    estimate_gib: float
    rss_gib: float  # peak resident size above the baseline: a cross-check
    baseline_gib: float

    @property
    def ratio(self) -> float:
        return self.estimate_gib / self.measured_gib


def grid(dtype: str) -> list[Case]:
    """Every configuration, without gradient checkpointing first (a run cut short has the whole
    shape x seq_len x LoRA/full grid of one of them)."""
    return [
        Case(shape, seq_len, lora, checkpointing, dtype)
        for checkpointing in (False, True)
        for shape in SHAPES
        for seq_len in SEQ_LENS
        for lora in (True, False)
    ]


def run(case: Case) -> Result:
    """`case` measured in a fresh interpreter (this script with --one)."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(asdict(case))],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **MALLOC_ENV},
    )
    if out.returncode != 0:
        raise RuntimeError(f"{case.label()} failed:\n{out.stderr[-3000:]}")
    values = json.loads(out.stdout.strip().splitlines()[-1])
    return Result(case, values["measured_gib"], values["estimate_gib"], values["rss_gib"], values["baseline_gib"])


class TensorPeak(TorchDispatchMode):
    """The most bytes of tensors allocated under it that were alive at once: each new storage an op
    returns counts until it is freed; views and in-place results of its inputs (a weight's transpose,
    AdamW's moments) are not new. (torch's MemTracker measures the same per module, but refuses
    a module called more than once in a pass, as the chunked output head is.)"""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.bytes = 0
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs:
                self._count(tensor.untyped_storage())  # not a view of an input, nor an input changed in place
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key = storage.data_ptr()
        if key in self.live or storage.nbytes() == 0:  # counted already (one output viewing another), or nothing
            return
        self.live[key] = storage.nbytes()
        self.bytes += storage.nbytes()
        self.peak = max(self.peak, self.bytes)
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        self.bytes -= self.live.pop(key)


def held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the parameters, buffers and optimizer state (each storage once)."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def measure(case: Case) -> dict[str, float]:
    """In this (fresh) process: the peak tensor memory of one trainer step of `case`, its peak resident
    memory above the baseline, and the plan's estimate."""
    from lorarl.config.algorithms import PPOLoss
    from lorarl.config.model import LoraConfig, ModelConfig
    from lorarl.config.trainer import OptimConfig, TrainerConfig
    from lorarl.launcher.memory_plan import DENSE_MASK, TrainerWork, shape_from_config, trainer_parts
    from lorarl.tiny_model import build_model
    from lorarl.trainer.batching import TrainSample
    from lorarl.trainer.model import apply_lora, enable_gradient_checkpointing, peak_memory_gib, trainable_parameters
    from lorarl.trainer.optim import build_optimizer
    from lorarl.trainer.packing import ForwardPasses
    from lorarl.trainer.rl import policy_gradient_loss
    from lorarl.trainer.trainer import forward_backward_step

    torch.manual_seed(0)
    attention = ModelConfig.model_fields["attn_implementation"].default
    hidden, layers, head_dim, vocab = SHAPES[case.shape]
    warm = build_model(300, 0, 1, 64, 1, 0, 32)
    warm.set_attn_implementation(attention)
    warm(torch.arange(64)[None]).logits.sum().backward()  # torch's kernels and thread pools, once
    del warm
    baseline = peak_memory_gib(torch.device("cpu"))

    model = build_model(vocab, 0, 1, hidden, layers, 0, head_dim).to(getattr(torch, case.dtype))
    model.set_attn_implementation(attention)
    lora = LoraConfig()
    if case.lora:
        model = apply_lora(model, lora)
    if case.checkpointing:
        enable_gradient_checkpointing(model)
    optimizer = build_optimizer(model, OptimConfig())
    for p in trainable_parameters(model):  # AdamW's moments, as from the second step on
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    prompt = case.seq_len // 4
    ids = torch.randint(2, vocab, (case.seq_len,)).tolist()
    sample = TrainSample(ids, [False] * prompt + [True] * (case.seq_len - prompt), [-1.0] * case.seq_len, 1.0)
    passes = ForwardPasses(packing=True, seq_len=case.seq_len, micro_batch_size=1, pad_id=1)
    chunk_size = TrainerConfig().logits_chunk_size
    loss = policy_gradient_loss(model, [sample], PPOLoss(), case.seq_len, chunk_size)
    held = held_bytes(model, optimizer)
    with TensorPeak() as step:
        forward_backward_step(model, [sample], loss, passes)
        optimizer.step()
    rss = peak_memory_gib(torch.device("cpu")) - baseline

    shape = shape_from_config(model.config, case.shape, "built here")
    assert shape is not None
    adapter = sum(p.numel() for p in trainable_parameters(model)) if case.lora else None
    work = TrainerWork(
        dtype_bytes=torch.finfo(getattr(torch, case.dtype)).bits // 8,
        adapter=adapter,
        tokens=case.seq_len,
        rows=1,
        row_width=case.seq_len,
        gradient_checkpointing=case.checkpointing,
        logits_chunk=chunk_size,
        dense_mask=attention if attention in DENSE_MASK else None,
        runtime_gib=0.0,
    )
    estimate = sum(p.gib for p in trainer_parts(shape, work))
    measured = (held + step.peak) / 2**30
    return {"measured_gib": measured, "estimate_gib": estimate, "rss_gib": rss, "baseline_gib": baseline}


def table(results: list[Result]) -> str:
    lines = [
        "| shape | seq_len | trained | checkpointing | measured GiB | estimate GiB | estimate / measured | RSS GiB |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(results, key=lambda r: (list(SHAPES).index(r.case.shape), r.case.seq_len, not r.case.lora)):
        c = r.case
        lines.append(
            f"| {c.shape} | {c.seq_len} | {'LoRA r8' if c.lora else 'full'} | {'on' if c.checkpointing else 'off'} "
            f"| {r.measured_gib:.3f} | {r.estimate_gib:.3f} | {r.ratio:.2f} | {r.rss_gib:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a Case as JSON: measure it in this process
    parser.add_argument("--shape", choices=list(SHAPES), action="append", help="only these shapes")
    parser.add_argument("--seq-len", type=int, choices=SEQ_LENS, action="append", help="only these seq_lens")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the weights' dtype")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(Case(**json.loads(args.one)))))
        return
    results = []
    for case in grid(args.dtype):
        if (args.shape and case.shape not in args.shape) or (args.seq_len and case.seq_len not in args.seq_len):
            continue
        results.append(run(case))
        r = results[-1]
        print(
            f"{case.label()}: measured {r.measured_gib:.3f} GiB, estimate {r.estimate_gib:.3f} ({r.ratio:.2f}), "
            f"RSS {r.rss_gib:.3f}",
            flush=True,
        )
    print(table(results))
    outside = [r for r in results if abs(r.ratio - 1) > TOLERANCE]
    baselines = [r.baseline_gib for r in results]
    print(
        f"{len(results) - len(outside)} of {len(results)} within ±{TOLERANCE:.0%}; RSS baseline (torch itself, "
        f"subtracted): {min(baselines):.2f}-{max(baselines):.2f} GiB"
    )


if __name__ == "__main__":
    main()
