"""Attention over one packed row: the dense-mask sdpa path against packed_sdpa, on the CPU.

    python benchmarks/attention.py [--lengths 2048 8192 16384] [--repeats 2]

For each row width L and row layout it times one forward + backward of the attention function alone
(the q/k/v of one layer in, their gradients out; the projections and the rest of the model are the
same for both paths), as the trainer calls it (trainer/attention.py, packing.py), and reports

  * mask: what the path builds to describe the row: "sdpa" the [1, 1, L, L] boolean mask of
    `PackedBatch.attention_mask`, "packed_sdpa" the additive masks of its segments with a long
    shared prompt (none where prompts are shorter than their rollouts);
  * peak: the peak resident memory that making the mask and the forward + backward add over the
    q/k/v inputs (ru_maxrss, each case in a process of its own);
  * time: seconds of the forward + backward, the fastest of --repeats after a warm-up run (on a
    shared machine the others are slowed by whatever else runs), on --threads threads.

Layouts: "samples of 1k" (L/1024 samples of 1,024 tokens, as sft packs them), "samples of 64" (the
many short samples of the CPU-sized configs: one sdpa call each for packed_sdpa), "shared, short
prompts" (2 groups of 4 rollouts, each group's prompt an eighth of its tokens: the rollouts recompute
the prompt's queries), "shared, long prompts" (2 groups of 4 rollouts with prompts half of their
group's tokens: an additive mask per rollout). The attention shape is that of a 2-layer hidden-256
Qwen3 (8 heads, 4 key-value heads, head_dim 32: `lorarl.tiny_model --hidden-size 256`), float32;
--heads/--kv-heads/--head-dim change it.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from typing import Any

import torch
from transformers import AttentionInterface, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

from lorarl.trainer.attention import PACKED_SDPA, SEGMENTS_KWARG
from lorarl.trainer.batching import TrainSample
from lorarl.trainer.packing import PackedBatch, SharedPrompt, collate_packed
from runner import after_warmup, json_from_child, markdown_head, markdown_row

SAMPLES = {"samples of 1k": 1024, "samples of 64": 64}  # the layouts of whole samples, by their length
LAYOUTS = (*SAMPLES, "shared, short prompts", "shared, long prompts")
PATHS = ("sdpa", PACKED_SDPA)


def sample(length: int) -> TrainSample:
    return TrainSample([1] * length, [True] * length)


def group(tokens: int, prompt_share: float) -> SharedPrompt:
    """4 rollouts sharing a prompt of `prompt_share` of the group's `tokens`."""
    prompt = int(tokens * prompt_share)
    rest = (tokens - prompt) // 4
    return SharedPrompt(prompt, tuple(sample(prompt + rest) for _ in range(4)))


def packed_row(layout: str, length: int) -> PackedBatch:
    units: list[TrainSample | SharedPrompt]
    if layout in SAMPLES:
        size = min(SAMPLES[layout], length)
        units = [sample(size) for _ in range(length // size)]
    else:
        units = [group(length // 2, 1 / 8 if layout == "shared, short prompts" else 1 / 2) for _ in range(2)]
    return collate_packed([units], pad_id=0, temperature=1.0)


def attention_layer(args: argparse.Namespace, path: str) -> Qwen3Attention:
    config = Qwen3Config(
        hidden_size=args.heads * args.head_dim,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        attn_implementation=path,  # type: ignore[call-arg]  # PretrainedConfig takes it through **kwargs
    )
    return Qwen3Attention(config, layer_idx=0)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_case(args: argparse.Namespace, layout: str, length: int, path: str) -> dict[str, Any]:
    """Run in a process of its own: time and memory of `path` on one row."""
    torch.manual_seed(0)
    batch = packed_row(layout, length)
    layer = attention_layer(args, path)
    q = torch.randn(1, args.heads, batch.input_ids.shape[1], args.head_dim, requires_grad=True)
    k, v = (torch.randn(1, args.kv_heads, q.shape[2], args.head_dim, requires_grad=True) for _ in range(2))
    grad = torch.randn(1, q.shape[2], args.heads, args.head_dim)
    before = peak_rss_mib()  # making the mask counts
    inputs = batch.attention_inputs(path, torch.float32, torch.device("cpu"))
    mask = inputs["attention_mask"]
    attend = AttentionInterface()[path]
    kwargs = {key: value for key, value in inputs.items() if key == SEGMENTS_KWARG}

    def step() -> float:
        t = time.perf_counter()
        out, _ = attend(layer, q, k, v, mask, scaling=args.head_dim**-0.5, **kwargs)
        out.backward(grad)
        q.grad = k.grad = v.grad = None
        return time.perf_counter() - t

    times = after_warmup([step() for _ in range(args.repeats + 1)])
    segments = inputs.get(SEGMENTS_KWARG)
    mask_bytes = segments.mask_bytes if segments is not None else mask.numel() * mask.element_size()
    return {"mask_mib": mask_bytes / 2**20, "peak_mib": peak_rss_mib() - before, "s": min(times)}


def in_subprocess(args: argparse.Namespace, layout: str, length: int, path: str) -> dict[str, Any]:
    options = {"threads": args.threads, "heads": args.heads, "kv-heads": args.kv_heads, "head-dim": args.head_dim}
    shape = [f"--{key}={value}" for key, value in options.items()]
    one = ["--one", layout, str(length), path, "--repeats", str(args.repeats)]
    return json_from_child([__file__, *shape, *one])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        layout, length, path = args.one
        print(json.dumps(one_case(args, layout, int(length), path)))
        return
    shape = f"{args.heads} heads / {args.kv_heads} key-value heads of {args.head_dim}"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {shape}, float32, attention forward + backward"
    )
    print("\n" + markdown_head(["L", "row", "path", "mask (MiB)", "peak added (MiB)", "fwd+bwd (s)", "time vs sdpa"]))
    for length in args.lengths:
        for layout in LAYOUTS:
            dense = None
            for path in PATHS:
                r = in_subprocess(args, layout, length, path)
                dense = r["s"] if path == "sdpa" else dense
                ratio = f"{r['s'] / dense:.3f}x" if dense and path != "sdpa" else ""
                cells = [f"{length:,}", layout, path, f"{r['mask_mib']:,.1f}", f"{r['peak_mib']:,.0f}", f"{r['s']:.3f}"]
                print(markdown_row([*cells, ratio]), flush=True)


if __name__ == "__main__":
    main()
