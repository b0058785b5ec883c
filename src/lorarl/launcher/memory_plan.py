"""The memory plan: each process's peak memory, estimated before anything starts.

A run that does not fit its GPUs would otherwise find out minutes in, with an out-of-memory
traceback from the trainer or vLLM. `rl` and `sft` (and their `--dry-run`) estimate, for each
process of the placement, what it will hold at its peak, from the model's shape alone: its
config.json (a local folder's, or for a hub name this machine cannot reach the published values in
lorarl.model_shapes), its parameters counted on a model built on the meta device (no weights read),
and the adapter's counted the same way after PEFT wraps it. docs/memory_plan.md has the formulas,
their validation against measured peaks, and the plan of every configs/gpu recipe.

The trainer (per rank): the weights (split over the ranks with parallel.fsdp, plus the layer being
gathered; with model.quantization in NF4, plus the buffers each layer is dequantized into, and an
MoE model's fused experts, which NF4 leaves in model.dtype), the
trained parameters' gradients and AdamW state (a LoRA adapter in float32, or every weight), the
activations of one forward pass of micro_batch_size x seq_len tokens (every layer's, or with
gradient checkpointing each layer's input plus one layer's), the output head's float32
logits (a few [logits_chunk_size, vocab] tensors, or [tokens, vocab] with chunking off), the packed
rows' attention mask, and a fixed runtime overhead (the CUDA context). A vLLM worker (per GPU):
its share of the weights and of the LoRA slots, a fixed allowance for activations and CUDA graphs,
and the KV cache in the rest of its gpu_memory_utilization, which must hold at least one sequence of
seq_len (vLLM refuses to start otherwise). On a machine without GPUs every process shares the RAM:
the plan is information, refused only when even its low end does not fit.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorarl.config.model import LoraConfig
from lorarl.config.run import RLConfig, RunMode
from lorarl.config.serve import ServeConfig, WorkersConfig
from lorarl.config.sft import SFTConfig
from lorarl.launcher.placement import visible_gpus
from lorarl.model_shapes import transformers_config
from lorarl.variants import variant_configs

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from lorarl.launcher.placement import Placement, Slot

GIB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Elements saved per token and decoder layer for the backward pass, beyond the projections' own
# sizes (docs/memory_plan.md, "Activations"): per hidden unit (the two RMSNorms' inputs, float32
# copies and outputs, the residual stream), per query/key/value head unit (projections, q/k norms,
# rotary, sdpa's inputs and output) and per MLP unit (gate, up, their activation and product).
ACT_PER_HIDDEN = 6
ACT_PER_ATTENTION = 4
ACT_PER_MLP = 4
# Live [chunk, vocab] float32 tensors while the output head's chunk is recomputed in backward
# (trainer/loss.py): its log-softmax and exp, kept for backward, and two gradients (measured: 4.0).
LOGITS_COPIES = 4
# A CUDA process's own memory beyond torch's tensors (context, cuBLAS workspaces, allocator slack).
CUDA_RUNTIME_GIB = 1.0
# What a vLLM worker takes beside weights and KV cache: the activations of its profiling pass and
# the CUDA graphs (an allowance, not measured here: no GPU).
VLLM_OVERHEAD_GIB = 2.5
# On a CPU the RAM plan is refused only when this fraction of it (the estimate's low end) does not fit.
CPU_REFUSE_FRACTION = 0.75
DEFAULT_DEVICE_GIB = 80.0
# A base in NF4 (model.quantization), per parameter: half a byte, a uint8 scale per 64 and a float32 one
# per 16,384 (double quantization), float32 scales per 64 for the embeddings; measured 0.528 at
# Qwen3-0.6B's shape (benchmarks/qlora.py), where the embeddings are a quarter of the weights.
NF4_BYTES_PER_PARAMETER = 0.53
# The attention implementations that get a dense [rows, 1, L, L] mask for packed rows (packing.py);
# packed_sdpa, FlexAttention and flash attention need none.
DENSE_MASK = ("sdpa", "eager")


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: its widths and its parameter count."""

    name: str
    source: str  # where its config came from, for the plan's header
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    parameters: int
    fused_experts: int = 0  # of those, in MoE experts fused into 3D tensors (transformers 5), which NF4 skips

    @property
    def layer_parameters(self) -> int:
        return (self.parameters - self.vocab * self.hidden) // self.layers


@dataclass(frozen=True)
class Part:
    what: str
    gib: float

    def describe(self) -> str:
        return f"{self.what} {self.gib:.1f}"


@dataclass
class ProcessPlan:
    """One process's estimate against what its device gives it (`capacity_gib`; None: unknown)."""

    process: str
    devices: str
    parts: list[Part]
    capacity_gib: float | None
    unit: str = ""  # what the figures are per ("per GPU", "per rank"), if not the whole process
    problem: str | None = None  # set when it cannot fit: the one-line reason and the keys to change
    extra: str = ""

    @property
    def total_gib(self) -> float:
        return sum(p.gib for p in self.parts)

    def columns(self) -> list[str]:
        """process, devices, estimate, capacity, parts: a row of the plan's table."""
        capacity = "-" if self.capacity_gib is None else f"{self.capacity_gib:.1f} GiB"
        unit = f"{self.unit}: " if self.unit else ""
        parts = ", ".join(part.describe() for part in self.parts)
        return [self.process, self.devices, f"{self.total_gib:.1f} GiB", capacity, f"{unit}{parts}{self.extra}"]


@dataclass
class MemoryPlan:
    header: str
    processes: list[ProcessPlan] = field(default_factory=list)
    footer: str = ""

    def table(self) -> str:
        """The plan as text: a header, a table of the processes, a footer (what `--dry-run` prints)."""
        rows = [["process", "devices", "estimate", "of", "parts (GiB)"], *(p.columns() for p in self.processes)]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[4] for row in rows]
        return "\n".join([self.header, *(lines if self.processes else []), *filter(None, [self.footer])]) + "\n"

    def problem(self) -> str | None:
        """The first process that cannot fit, as one line naming the keys to change; None: all fit."""
        return next((f"memory plan: {p.problem}" for p in self.processes if p.problem), None)


# ---- the model's shape ------------------------------------------------------------------------


def model_config(name: str) -> tuple[PretrainedConfig, str] | None:
    """The model's config and where it came from: a local folder's config.json, lorarl's table of
    published configs (model_shapes), or the hub where it can be reached; None: none of them."""
    from transformers import AutoConfig

    path = Path(name).expanduser()
    if path.is_dir():
        return AutoConfig.from_pretrained(path), f"{path}/config.json"
    try:
        return transformers_config(name), "lorarl's table of published configs (lorarl/model_shapes.py)"
    except KeyError:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    try:
        return AutoConfig.from_pretrained(name), "the hub's config.json"
    except Exception:  # no network, no such model, not a transformers model: no plan, no refusal
        return None


@functools.cache
def model_shape(name: str) -> ModelShape | None:
    """The shape of model `name` (a folder or a hub name), its parameters counted on the meta device;
    None where its config cannot be found or is not a decoder's."""
    found = model_config(name)
    return None if found is None else shape_from_config(found[0], name, found[1])


def shape_from_config(config: PretrainedConfig, name: str, source: str) -> ModelShape | None:
    """The shape of the model `config` describes (None: not a decoder transformers builds)."""
    text = config.get_text_config()
    try:
        hidden, heads = text.hidden_size, text.num_attention_heads
        parameters = list(meta_model(config).parameters())
        return ModelShape(
            name=name,
            source=source,
            hidden=hidden,
            layers=text.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or hidden // heads,
            intermediate=text.intermediate_size,
            vocab=text.vocab_size,
            parameters=sum(p.numel() for p in parameters),
            fused_experts=sum(p.numel() for p in parameters if p.dim() > 2),
        )
    except (AttributeError, ValueError):
        return None


def meta_model(config: PretrainedConfig, attn_implementation: str | None = None) -> Any:
    """The model `config` describes, built on the meta device (shapes, no weights); transformers
    refuses an `attn_implementation` it cannot use here (e.g. flash attention not installed) as it
    would when loading the weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from lorarl.trainer import attention  # noqa: F401  (registers "packed_sdpa" with transformers)

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def _count(model: Any, trainable: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


class AdapterError(ValueError):
    """[model.lora] cannot wrap the model (apply_lora's message names the key)."""


def adapter_parameters(name: str, lora: LoraConfig) -> int:
    """Parameters of the LoRA adapter `lora` on model `name`, counted after PEFT wraps a meta model
    (an init_adapter is counted from [model.lora]'s settings, which it must match). Fused MoE experts
    count at PEFT's ranks: gate_up_proj at 2r, down_proj at r, per expert."""
    return _meta_adapter(name, lora.model_dump_json())[0]


def expert_lora(name: str, lora: LoraConfig) -> list[str]:
    """The fused MoE expert parameters `lora` puts LoRA on in model `name` (trainer.model's
    fused_expert_parameters, on a meta model), e.g. ["down_proj", "gate_up_proj"]; [] for a dense model,
    LoRA on attention alone, or a model whose config cannot be found."""
    return [] if model_config(name) is None else _meta_adapter(name, lora.model_dump_json())[1]


def serves_expert_lora(cfg: RLConfig) -> bool:
    """Whether an adapter of the run (a variant's too) puts LoRA on an MoE model's fused experts, which
    vLLM loads in PEFT's layout only with --enable-mixed-moe-lora-format (docs/moe.md)."""
    if cfg.model.full_finetune:
        return False
    return any(expert_lora(c.model.name, c.lora) for c in [c for _, c in variant_configs(cfg)] or [cfg])


@functools.cache
def _meta_adapter(name: str, lora_json: str) -> tuple[int, list[str]]:
    from lorarl.trainer.model import apply_lora, fused_expert_parameters

    found = model_config(name)
    assert found is not None, "model_shape(name) first"
    lora = LoraConfig.model_validate_json(lora_json).model_copy(update={"init_adapter": None})
    try:
        model = apply_lora(meta_model(found[0]), lora)
    except ValueError as e:  # target_modules that adapt nothing: the trainer would die at start
        raise AdapterError(str(e)) from None
    return _count(model, trainable=True), fused_expert_parameters(model)


# ---- the estimates ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerWork:
    """What one trainer rank holds and computes."""

    dtype_bytes: int
    adapter: int | None  # trained adapter parameters (every variant's); None: every weight trains
    tokens: int  # per forward pass
    rows: int
    row_width: int
    gradient_checkpointing: bool
    logits_chunk: int  # 0: the whole pass at once
    dense_mask: str | None  # the attention implementation where packed rows get a dense mask (DENSE_MASK)
    shards: int = 1  # ranks the weights are split over (parallel.fsdp)
    runtime_gib: float = CUDA_RUNTIME_GIB
    quantized: bool = False  # model.quantization: a 4-bit base, dequantized a layer at a time


def trainer_parts(shape: ModelShape, work: TrainerWork) -> list[Part]:
    """The peak of one trainer rank: what it always holds, plus the larger of a forward/backward pass
    and the optimizer step's temporaries."""
    b = work.dtype_bytes
    # NF4 quantizes the linear layers, the embeddings and the head; fused MoE experts stay in model.dtype.
    experts = shape.fused_experts if work.quantized else 0
    per_parameter = NF4_BYTES_PER_PARAMETER if work.quantized else b
    weights = (shape.parameters - experts) * per_parameter / work.shards
    if work.shards > 1:
        weights += shape.layer_parameters * b  # the layer FSDP has gathered
    if work.adapter is None:  # gradients and AdamW's two moments, in the weights' dtype
        trained, step = 3 * shape.parameters * b / work.shards, shape.parameters * b / work.shards
        trained_what = "grads+AdamW"
    else:  # PEFT keeps adapters in float32: weights, gradients, two moments
        trained, step = 16 * work.adapter, 4 * work.adapter
        trained_what = "adapter+grads+AdamW"
    activations, logits, mask = activation_bytes(shape, work), logits_bytes(shape, work), mask_bytes(shape, work)
    passing = activations + logits + mask
    parts = [Part("weights (nf4)" if work.quantized else "weights", weights / GIB)]
    if experts:
        parts.append(Part("experts (not quantized)", experts * b / work.shards / GIB))
    if work.quantized:
        parts.append(Part("dequantized", dequantized_bytes(shape, b) / GIB))
    parts += [
        Part(trained_what, trained / GIB),
        Part("activations" + (" (checkpointed)" if work.gradient_checkpointing else ""), activations / GIB),
        Part(f"logits ({_chunks(work.logits_chunk)})", logits / GIB),
    ]
    if work.dense_mask:
        parts.append(Part("attention mask", mask / GIB))
    if step > passing:  # the optimizer step's temporaries outgrow the pass (e.g. full fine-tuning)
        parts.append(Part("optimizer step beyond the pass", (step - passing) / GIB))
    if work.runtime_gib:
        parts.append(Part("runtime", work.runtime_gib))
    return parts


def dequantized_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """A 4-bit base's dequantization buffers: its largest matrix (the output head, or an MLP projection)
    in the weights' dtype, twice (the forward pass's copy and the backward pass's, which overlap)."""
    return 2 * max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate) * dtype_bytes


def _chunks(chunk: int) -> str:
    return f"chunks of {chunk}" if chunk else "unchunked"


def activation_bytes(shape: ModelShape, work: TrainerWork) -> float:
    """Saved activations of one forward pass: every layer's, or with gradient checkpointing every
    layer's input plus the one layer recomputed at a time."""
    b, tokens = work.dtype_bytes, work.tokens
    attention = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    per_layer = ACT_PER_HIDDEN * shape.hidden + ACT_PER_ATTENTION * attention + ACT_PER_MLP * shape.intermediate
    if work.adapter is not None and b < 4:
        # PEFT casts each adapted projection's input to the adapter's float32 and keeps it.
        per_layer += 2 * (5 * shape.hidden + shape.heads * shape.head_dim + shape.intermediate)
    outside = 4 * shape.hidden  # embeddings' output, final norm, the hidden states the head reads
    if work.gradient_checkpointing:
        return tokens * b * (shape.layers * shape.hidden + per_layer + outside)
    return tokens * b * (shape.layers * per_layer + outside)


def mask_bytes(shape: ModelShape, work: TrainerWork) -> float:
    """The packed rows' dense mask and what attention makes of it, kept for backward by every layer (with
    gradient checkpointing, by the one recomputed): sdpa's mask is boolean, and torch's sdpa turns it
    into an additive one in the weights' dtype in each layer (measured on the CPU: docs/memory_plan.md);
    eager's is additive from the start, and eager attention keeps each head's [L, L] weights as well."""
    if work.dense_mask is None:
        return 0.0
    entries = work.rows * work.row_width**2
    layers = 1 if work.gradient_checkpointing else shape.layers
    if work.dense_mask == "eager":
        return entries * work.dtype_bytes * (1 + layers * shape.heads)
    return entries * (1 + layers * work.dtype_bytes)


def logits_bytes(shape: ModelShape, work: TrainerWork) -> float:
    chunk = min(work.logits_chunk or work.tokens, work.tokens)
    return LOGITS_COPIES * chunk * shape.vocab * 4


def vllm_parts(
    shape: ModelShape, dtype_bytes: int, tp: int, lora_parameters: int, budget_gib: float
) -> tuple[list[Part], float]:
    """What one vLLM worker takes of each of its GPUs (its budget: gpu_memory_utilization of it), and
    the KV cache bytes per token on one GPU."""
    weights = shape.parameters * dtype_bytes / tp / GIB
    loras = lora_parameters * dtype_bytes / tp / GIB
    kv_per_token = 2 * shape.layers * max(1, shape.kv_heads // tp) * shape.head_dim * dtype_bytes
    kv = budget_gib - weights - loras - VLLM_OVERHEAD_GIB
    parts = [Part("weights", weights), Part("LoRA slots", loras), Part("activations+graphs", VLLM_OVERHEAD_GIB)]
    return [*parts, Part("KV cache", max(0.0, kv))], kv_per_token


# ---- the plans of rl and sft ------------------------------------------------------------------


def rl_memory_plan(cfg: RLConfig, placement: Placement, device_memory_gib: float | None = None) -> MemoryPlan:
    """The plan of every process of `rl @ cfg` placed as `placement`. `device_memory_gib`: each GPU's
    memory as RunMode gives it (None: as `device_memory` finds it)."""
    shape = model_shape(cfg.model.name)
    if shape is None:
        return MemoryPlan(f"memory plan: none, the shape of {cfg.model.name} is unknown here (no config.json found)")
    on_gpu = placement.device_gpus > 0
    device_gib, how = device_memory(device_memory_gib, placement.pretended) if on_gpu else (ram_gib(), "")
    plan = MemoryPlan(_header(shape, device_gib, how))
    adapter = _rl_adapter(cfg, shape)
    for slot in placement.slots:
        if slot.name.startswith("inference-"):
            plan.processes.append(_vllm_plan(cfg, _rl_lora_slots(cfg, shape), shape, slot, device_gib, on_gpu))
        elif slot.name == "trainer":
            plan.processes.append(_rl_trainer_plan(cfg, shape, slot, adapter, device_gib, on_gpu, placement))
    if not on_gpu and not placement.ray:  # a Ray cluster's processes are not in this machine's RAM
        _check_ram(plan, device_gib)
    return plan


def _rl_adapter(cfg: RLConfig, shape: ModelShape) -> int | None:
    if cfg.model.full_finetune:
        return None
    configs = [c for _, c in variant_configs(cfg)] if cfg.variants else [cfg]
    return sum(adapter_parameters(shape.name, c.lora) for c in configs)


def _header(shape: ModelShape, device_gib: float, how: str) -> str:
    """How: where the GPU size comes from; "": no GPU, the plan is for the RAM."""
    where = (
        f"GPUs of {device_gib:.0f} GiB ({how})"
        if how
        else f"no GPU: every process in this machine's {device_gib:.1f} GiB of RAM (information)"
    )
    return (
        f"memory plan: {shape.name}, {_millions(shape.parameters)} parameters, vocab {shape.vocab:,}, shape from "
        f"{shape.source}; {where}; docs/memory_plan.md"
    )


def _millions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def device_memory(given: float | None, pretended: bool) -> tuple[float, str]:
    """Memory per GPU and where that figure comes from: `given` (device_memory_gib), else (GPUs
    `pretended` by a dry run, or none here) DEFAULT_DEVICE_GIB, else torch's smallest GPU."""
    if given is not None:
        return given, "device_memory_gib"
    import torch

    if pretended or not torch.cuda.is_available():
        return DEFAULT_DEVICE_GIB, "assumed: device_memory_gib sets it"
    sizes = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
    return min(sizes) / GIB, "as torch reports them"


def ram_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def _rl_lora_slots(cfg: RLConfig, shape: ModelShape) -> int:
    """Parameters of every adapter slot of an `rl` worker (--max-loras of them at --max-lora-rank)."""
    from lorarl.inference.server import rl_adapters

    adapters = rl_adapters(cfg, serves_expert_lora(cfg))
    if adapters is None:
        return 0
    per_rank = adapter_parameters(shape.name, cfg.lora) / cfg.lora.rank  # linear in the rank
    return round(per_rank * adapters.max_rank * adapters.slots)


def _vllm_plan(
    cfg: WorkersConfig, lora: int, shape: ModelShape, slot: Slot, device_gib: float, on_gpu: bool
) -> ProcessPlan:
    """A vLLM worker's plan; `lora`: the parameters of its adapter slots."""
    inf = cfg.inference
    b = _DTYPE_BYTES[cfg.model.dtype]
    if not on_gpu:
        parts = [Part("weights", shape.parameters * b / GIB), Part("KV cache", float(inf.kv_cache_gib))]
        return ProcessPlan(slot.name, slot.devices, parts, None, extra=" (inference.kv_cache_gib)")
    budget = inf.memory_fraction * device_gib
    parts, kv_per_token = vllm_parts(shape, b, inf.tensor_parallel_size, lora, budget)
    kv_gib = budget - sum(p.gib for p in parts[:-1])
    tokens = int(max(0.0, kv_gib) * GIB / kv_per_token)
    plan = ProcessPlan(slot.name, slot.devices, parts, device_gib, unit="per GPU")
    plan.extra = f" ({tokens:,} tokens: {tokens / cfg.seq_len:.1f} x seq_len)"
    if tokens < cfg.seq_len:
        plan.problem = (
            f"{slot.name} on {slot.devices}: inference.gpu_memory_utilization {inf.memory_fraction:g} x "
            f"{device_gib:.0f} GiB = {budget:.1f} GiB per GPU holds weights {parts[0].gib:.1f} + LoRA slots "
            f"{parts[1].gib:.1f} + {VLLM_OVERHEAD_GIB} GiB of activations and graphs, leaving KV cache for "
            f"{tokens:,} tokens, less than one sequence of seq_len = {cfg.seq_len}; raise "
            "inference.gpu_memory_utilization or inference.tensor_parallel_size, or lower seq_len"
        )
    return plan


def _rl_trainer_plan(
    cfg: RLConfig,
    shape: ModelShape,
    slot: Slot,
    adapter: int | None,
    device_gib: float,
    on_gpu: bool,
    placement: Placement,
) -> ProcessPlan:
    from lorarl.trainer.packing import SHARED_ROW_FACTOR

    trainer = cfg.trainer
    width = cfg.seq_len * (SHARED_ROW_FACTOR if trainer.packing and trainer.share_prompts else 1)
    work = _trainer_work(
        cfg,
        adapter,
        trainer.micro_batch_size,
        width,
        trainer.packing,
        trainer.gradient_checkpointing,
        trainer.logits_chunk_size,
        trainer.parallel.dp if trainer.parallel.fsdp else 1,
        on_gpu,
    )
    shared = bool(set(slot.gpus) & set(placement.shared))
    capacity = device_gib * (1 - cfg.inference.memory_fraction) if shared else device_gib
    plan = ProcessPlan(slot.name, slot.devices, trainer_parts(shape, work), capacity if on_gpu else None)
    plan.unit = "per rank" if trainer.parallel.dp > 1 else ""
    if on_gpu:
        plan.problem = _trainer_problem(plan, cfg, work, shared)
    return plan


def _trainer_work(
    cfg: RLConfig | SFTConfig | ServeConfig,
    adapter: int | None,
    micro_batch_size: int,
    row_width: int,
    packing: bool,
    checkpointing: bool,
    logits_chunk: int,
    shards: int,
    on_gpu: bool,
) -> TrainerWork:
    attention = cfg.model.attn_implementation
    rows = max(1, micro_batch_size * cfg.seq_len // row_width)
    return TrainerWork(
        dtype_bytes=_DTYPE_BYTES[cfg.model.dtype],
        adapter=adapter,
        tokens=micro_batch_size * cfg.seq_len,
        rows=rows,
        row_width=row_width,
        gradient_checkpointing=checkpointing,
        logits_chunk=logits_chunk,
        dense_mask=attention if packing and attention in DENSE_MASK else None,
        shards=shards,
        runtime_gib=CUDA_RUNTIME_GIB if on_gpu else 0.0,
        quantized=cfg.model.quantization != "none",
    )


def _trainer_problem(
    plan: ProcessPlan, cfg: RLConfig | SFTConfig | ServeConfig, work: TrainerWork, shared: bool
) -> str | None:
    assert plan.capacity_gib is not None
    if plan.total_gib <= plan.capacity_gib:
        return None
    rl = not isinstance(cfg, SFTConfig)  # a [trainer] section
    prefix = "trainer." if rl else ""
    changes = [f"lower {prefix}micro_batch_size" + ("" if rl else " or seq_len")]
    if rl and not work.gradient_checkpointing:
        changes.append("set trainer.gradient_checkpointing = true")
    if work.logits_chunk == 0 or work.logits_chunk > 1024:
        changes.append(f"set {prefix}logits_chunk_size to 512 or less")
    if work.shards == 1:
        changes.append(f"shard the weights with {prefix}parallel.fsdp (parallel.dp >= 2)")
    if shared:
        changes += ["lower inference.gpu_memory_utilization", "give the trainer a GPU of its own (trainer.gpu_ids)"]
    parts = ", ".join(p.describe() for p in plan.parts)
    where = f"{'its share of ' if shared else ''}{plan.capacity_gib:.1f} GiB"
    return (
        f"{plan.process} on {plan.devices} needs ~{plan.total_gib:.1f} GiB{' per rank' if plan.unit else ''} "
        f"({parts}) but has {where}: {', '.join(changes)}"
    )


def _check_ram(plan: MemoryPlan, ram: float) -> None:
    total = sum(p.total_gib for p in plan.processes)
    plan.footer = f"together {total:.1f} GiB of {ram:.1f} GiB of RAM (torch's own ~0.5 GiB per process not counted)"
    if total * CPU_REFUSE_FRACTION > ram and plan.processes:
        worst = max(plan.processes, key=lambda p: p.total_gib)
        keys = "micro_batch_size, seq_len, gradient_checkpointing, logits_chunk_size" + (
            ", inference.kv_cache_gib" if worst.process.startswith("inference") else ""
        )
        worst.problem = (
            f"the processes need ~{total:.1f} GiB together ({worst.process} {worst.total_gib:.1f}), more than "
            f"this machine's {ram:.1f} GiB of RAM; lower {keys}"
        )


def serve_memory_plan(cfg: ServeConfig, placement: Placement, device_memory_gib: float | None = None) -> MemoryPlan:
    """The plan of `lorarl-serve @ cfg` placed as `placement`: its vLLM workers with serve.max_loras adapter
    slots at serve.max_rank, and one trainer holding serve.max_tenants adapters of that rank (attention
    and MLP, as tenants train them) with their AdamW states, and the passes of its forward/backward."""
    from lorarl.inference.server import serve_adapters

    shape = model_shape(cfg.model.name)
    if shape is None:
        return MemoryPlan(f"memory plan: none, the shape of {cfg.model.name} is unknown here (no config.json found)")
    on_gpu = placement.device_gpus > 0
    device_gib, how = device_memory(device_memory_gib, placement.pretended) if on_gpu else (ram_gib(), "")
    plan = MemoryPlan(_header(shape, device_gib, how))
    adapters = serve_adapters(cfg)
    per_rank = adapter_parameters(shape.name, LoraConfig(rank=1))  # the tenants' targets, linear in the rank
    for slot in placement.slots:
        if slot.name.startswith("inference-"):
            lora = per_rank * adapters.max_rank * adapters.slots
            plan.processes.append(_vllm_plan(cfg, lora, shape, slot, device_gib, on_gpu))
        elif slot.name == "trainer":
            t = cfg.trainer
            tenants = per_rank * cfg.serve.max_rank * cfg.serve.max_tenants
            work = _trainer_work(
                cfg, tenants, t.micro_batch_size, cfg.seq_len, t.packing, t.gradient_checkpointing,
                t.logits_chunk_size, 1, on_gpu,
            )  # fmt: skip
            shared = bool(set(slot.gpus) & set(placement.shared))
            capacity = device_gib * (1 - cfg.inference.memory_fraction) if shared else device_gib
            process = ProcessPlan(slot.name, slot.devices, trainer_parts(shape, work), capacity if on_gpu else None)
            if on_gpu:
                process.problem = _trainer_problem(process, cfg, work, shared)
            plan.processes.append(process)
    if not on_gpu:
        _check_ram(plan, device_gib)
    return plan


def sft_memory_plan(cfg: SFTConfig, mode: RunMode) -> MemoryPlan:
    """The plan of `sft @ cfg` run as `mode`: its data-parallel ranks, each on a GPU of its own (or the CPU)."""
    gpus = visible_gpus(mode)
    shape = model_shape(cfg.model.name)
    if shape is None:
        return MemoryPlan(f"memory plan: none, the shape of {cfg.model.name} is unknown here (no config.json found)")
    on_gpu = gpus > 0
    pretended = mode.dry_run_devices is not None
    device_gib, how = device_memory(mode.device_memory_gib, pretended) if on_gpu else (ram_gib(), "")
    plan = MemoryPlan(_header(shape, device_gib, how))
    adapter = None if cfg.model.lora is None else adapter_parameters(shape.name, cfg.model.lora)
    shards = cfg.parallel.dp if cfg.parallel.fsdp else 1
    work = _trainer_work(
        cfg, adapter, cfg.micro_batch_size, cfg.seq_len, cfg.packing, False, cfg.logits_chunk_size, shards, on_gpu
    )
    ranks = cfg.parallel.dp
    devices = (f"gpu 0-{ranks - 1}" if ranks > 1 else "gpu 0") if on_gpu else "cpu"
    process = ProcessPlan("sft", devices, trainer_parts(shape, work), device_gib if on_gpu else None)
    process.unit = "per rank" if ranks > 1 else ""
    plan.processes.append(process)
    if on_gpu:
        process.problem = _trainer_problem(process, cfg, work, shared=False)
    else:
        _check_ram(plan, device_gib)
    return plan
