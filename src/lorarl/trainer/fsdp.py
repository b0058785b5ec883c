"""FSDP2 for the trainers (`parallel.fsdp`): each data-parallel rank keeps 1/N of every weight.

`shard_model` makes one shard group per decoder layer: a layer's weights are all-gathered just
before its forward (and again for its backward) and freed after, so a rank holds its shards plus
about one whole layer at a time. The data parallel of distributed.py stays as it is: each rank
trains on its share of the batch and its loss is already its share of the step's loss, so the
gradients are reduce-scattered as a sum (FSDP's default is the mean).

What sharding asks of the loops: every forward pass all-gathers from every rank, so all ranks make
the same number of passes (`DataParallel.same_passes`), and saving gathers the weights and the
optimizer state (collectives: every rank calls them, rank 0 gets the result). Checkpoints keep the
format of an unsharded run, so a run resumes with or without FSDP.
"""

from __future__ import annotations

from typing import Any

import peft
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor


def shard_model(model: torch.nn.Module) -> None:
    """Shard `model` in place over all ranks onto this rank's device (the GPU set by
    init_data_parallel, or the CPU): one group per decoder layer, one for the rest (embeddings, final
    norm, output head). The parameters are new objects afterwards: build the optimizer after this."""
    for layer in reversed(decoder_layers(model)):  # a nested group must exist before the one around it
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # the setting is per group
            module.set_gradient_divide_factor(1.0)
            # Without this FSDP reduces with NCCL's PREMUL_SUM(1 / factor), which gloo lacks.
            module.set_force_sum_reduction_for_comms(True)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that transformers keeps whole when it splits a model over devices
    (`_no_split_modules`: the decoder layers), outermost first."""
    base = model.get_base_model() if isinstance(model, peft.PeftModel) else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"parallel.fsdp: found no decoder layers to shard in {type(base).__name__} (the classes its "
            f"_no_split_modules names: {sorted(names) or 'none'})"
        )
    return layers


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


@torch.no_grad()
def gathered_weights(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """What a sharded model saves, unsharded and on the CPU: of a PEFT model its trainable weights
    (the adapter and any modules_to_save, which PEFT's save_pretrained picks out by name), of a plain
    model every weight and persistent buffer. Rank 0 gets them, the other ranks {}; an unsharded model
    None (it saves its own weights). Collective on a sharded model: every rank must call it."""
    if not is_sharded(model):
        return None
    adapter_only = isinstance(model, peft.PeftModel)  # not the frozen base: it can be far larger
    weights: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, value in model.state_dict(keep_vars=True).items():
        # A tied weight (embeddings and output head) is saved once, under its first name, as
        # safetensors.torch.save_model does; safetensors.torch.load_model restores the tie.
        if (adapter_only and not value.requires_grad) or id(value) in seen:
            continue
        seen.add(id(value))
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if dist.get_rank() == 0:
            weights[name] = full.cpu()
    return weights


def gathered_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()` as a process training the unsharded model would have it (every tensor
    whole, on the CPU, parameters numbered in param_groups order), on rank 0; {} on the others.
    Collective: every rank must call it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer, options=options))
    if not state:
        return {}
    # torch keys the parameters by name here, in the optimizer's order.
    number = {name: i for i, name in enumerate(n for group in state["param_groups"] for n in group["params"])}
    return {
        "state": {number[name]: s for name, s in state["state"].items()},
        "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in state["param_groups"]],
    }


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an unsharded `optimizer.state_dict()` (from `gathered_optimizer_state` or a run without
    FSDP) into the optimizer of the sharded model: each rank keeps its shards. Collective."""
    names = {p: n for n, p in model.named_parameters()}
    order = [names[p] for group in optimizer.param_groups for p in group["params"]]
    by_name: dict[str, Any] = {
        "state": {order[i]: s for i, s in state["state"].items()},
        "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
