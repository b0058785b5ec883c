"""Checks that `rl` and `sft` make before they clear or start anything, `--dry-run` included.

Each mistake here would otherwise surface minutes later, after vLLM has started (or, worse, after
the previous run's outputs were cleared). Every check raises `PreflightError` with one line that
names the key and the value at fault.

What loading the model would find is found from files' headers and the model's shapes, never by
loading weights: the model folder's config.json, tokenizer and the shapes its safetensors headers
declare, against the model config.json describes, built on the meta device with the configured
attention implementation (which transformers refuses there as it would at load time); an init
adapter's tensors against the modules of that model. Environments are built to measure their
prompts against seq_len: built-ins and reasoning-gym tasks always, a user's (declared) environment
only for a start, since a dry run calls no user function.
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import json
import logging
import os
import random
import re
import socket
import sys
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorarl.config.algorithms import CustomAdvantage, CustomLoss
from lorarl.config.loader import json_object
from lorarl.config.model import LoraConfig, ModelConfig
from lorarl.config.run import RLConfig, RLRunMode, RunMode
from lorarl.config.serve import ServeConfig, WorkersConfig
from lorarl.config.sft import SFTConfig
from lorarl.file_kinds import shortened
from lorarl.inference.health import check_served_model
from lorarl.inference.server import adapter_slots, given_max_loras
from lorarl.launcher.memory_plan import (
    AdapterError,
    MemoryPlan,
    expert_lora,
    meta_model,
    model_config,
    rl_memory_plan,
    serve_memory_plan,
    sft_memory_plan,
)
from lorarl.launcher.placement import Placement, place, visible_gpus
from lorarl.launcher.ray_bundles import plan_bundles, ray_placement
from lorarl.plugins import ArgsError, PluginError
from lorarl.variants import variant_configs

if TYPE_CHECKING:
    from lorarl.orchestrator.envs import Environment

# The checks that need torch, PEFT or transformers (the adapter's targets, environments, user losses)
# import the modules that hold them when they run: loading those libraries takes ~10 s of a 2-core
# machine, which a config refused at its first key (most bad input) should not wait for.

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_RAY_ADDRESS = re.compile(r"^(auto|(ray://)?[\w.-]+:\d+)$")
log = logging.getLogger("lorarl.preflight")
# Attention implementations that need a GPU to train (FlexAttention has no backward on the CPU).
_GPU_ATTENTION = ("flex_attention", "flash_attention_2", "flash_attention_3")
# Training examples per environment whose prompts are measured against seq_len (besides the eval examples).
_PROMPTS_MEASURED = 32
# A PEFT adapter's LoRA tensor: base_model.model.<module path>.lora_A.weight (or lora_B).
_LORA_TENSOR = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<half>[AB])\.weight$")


class PreflightError(Exception):
    """A config that cannot run; str() is one line for the user."""


def check_rl(cfg: RLConfig, mode: RLRunMode) -> Placement:
    """Every check of `rl @ cfg` run as `mode` on this machine's GPUs (or those a dry run pretends);
    returns where each process goes."""
    gpus = visible_gpus(mode)
    check_model(cfg.model.name)
    check_seq_len(cfg.model.name, cfg.seq_len)
    check_cluster(cfg, mode.auto_resume)
    if mode.auto_resume and cfg.trainer.ckpt.interval is None:  # it would restart from no checkpoint
        raise PreflightError(
            f"--auto_resume {mode.auto_resume} restarts from the latest checkpoint, and trainer.ckpt.interval "
            "is not set (no checkpoint is written): set trainer.ckpt.interval, or leave --auto_resume out"
        )
    try:
        # A server of inference.urls must be vLLM serving model.name (a ServerCheckError is a ValueError).
        for url in cfg.inference.urls:
            check_served_model(url, cfg.model.name, cfg.inference.api_key)
        check_adapter_slots(cfg)
        placement = _placement(cfg, gpus, mode)
    except ValueError as e:  # PlacementError too
        raise PreflightError(str(e)) from None
    # The run's adapter, or each variant's (its effective config), named in the message.
    adapters = [(f"variant {name!r}: ", c) for name, c in variant_configs(cfg)] or [("", cfg)]
    for where, adapter_cfg in adapters:
        try:
            check_adapter(adapter_cfg)
            check_model_loads(adapter_cfg.model, placement.on_gpu)
            check_expert_lora_served(adapter_cfg, placement)
            check_prompts(adapter_cfg, user_code=not mode.dry_run)
        except PreflightError as e:
            raise PreflightError(f"{where}{e}") from None
    warn_single_rollout_groups(cfg)
    if not cfg.inference.urls and cfg.cluster.backend == "local":  # Ray's workers listen on their own nodes
        check_ports(cfg.inference.host, cfg.inference.port, cfg.inference.num_workers)
    check_memory(lambda: rl_memory_plan(cfg, placement, mode.device_memory_gib))
    return placement


def _placement(cfg: WorkersConfig, gpus: int, mode: RunMode) -> Placement:
    """Where each process goes: on this machine's `gpus`, or in Ray bundles. On Ray, a dry run shows GPU
    bundles when this machine has GPUs (or pretends to); a run asks the cluster."""
    if cfg.cluster.backend == "ray":
        return ray_placement(cfg, plan_bundles(cfg, gpus > 0))
    return place(cfg, gpus, pretended=mode.dry_run_devices is not None)


def check_adapter_slots(cfg: RLConfig) -> None:
    """A user's --max-loras (inference.extra_args) must hold every adapter version a worker can have
    loaded at once; ValueError naming the key."""
    slots, given = adapter_slots(cfg), given_max_loras(cfg.inference.extra_args)
    if given is not None and given < slots:
        raise ValueError(
            f"inference.extra_args sets --max-loras {given}, but rollouts may lag "
            f"{cfg.orchestrator.max_policy_lag} versions (max_async_level / max_off_policy_steps)"
            + (f" for each of {len(cfg.variants)} variants" if cfg.variants else "")
            + f", so {slots} adapter versions can be loaded: raise --max-loras or leave it out (rl derives it)"
        )


def check_adapter(cfg: RLConfig) -> None:
    """What one adapter of `rl` needs: a LoRA that vLLM can serve (unless model.full_finetune), its
    environments, its user functions."""
    from lorarl.trainer.model import check_lora_for_rl

    try:
        if not cfg.model.full_finetune:
            check_lora_for_rl(cfg.lora)
    except ValueError as e:
        raise PreflightError(str(e)) from None
    check_environments(cfg)
    check_algorithms(cfg)


def check_expert_lora_served(cfg: RLConfig, placement: Placement) -> None:
    """vLLM serves LoRA on an MoE model's experts only with its Triton MoE LoRA kernels, which its CPU
    build lacks (docs/moe.md): refused where rl would start vLLM on the CPU."""
    if cfg.model.full_finetune or cfg.inference.urls or placement.gpus > 0:
        return
    try:
        experts = expert_lora(cfg.model.name, cfg.lora)
    except AdapterError as e:
        raise PreflightError(str(e)) from None
    if experts:
        raise PreflightError(
            f"[model.lora] target_modules puts LoRA on the experts of the MoE model {cfg.model.name} "
            f"({', '.join(experts)}), and serving expert LoRA needs a GPU build of vLLM (its Triton MoE LoRA "
            "kernels), but rl would start vLLM on the CPU here: run on a GPU machine, or leave the experts out, "
            'e.g. target_modules = ["q_proj", "k_proj", "v_proj", "o_proj"]'
        )


def check_cluster(cfg: WorkersConfig, auto_resume: int = 0) -> None:
    """[cluster] asks for something this config and machine can do (`auto_resume`: RLRunMode's)."""
    cluster, inf = cfg.cluster, cfg.inference
    if cluster.backend == "local":
        # Every key but backend and shared_fs is Ray's: set here (off its default), it would do nothing.
        for key in (
            "address",
            "trainer_resources",
            "inference_resources",
            "placement_timeout",
            "connect_timeout",
            "node_dir",
        ):
            if getattr(cluster, key) != type(cluster).model_fields[key].default:
                raise PreflightError(f'cluster.{key} is for cluster.backend = "ray": set that, or leave {key} out')
        if not cluster.shared_fs:
            raise PreflightError(
                'cluster.shared_fs = false is for cluster.backend = "ray": on one machine it is shared'
            )
        return
    if cluster.address is not None and not _RAY_ADDRESS.match(cluster.address):
        raise PreflightError(
            f'cluster.address {cluster.address!r}: give "auto", "host:port" or "ray://host:port", or leave it out '
            "to start a Ray instance on this machine"
        )
    for key, value in (("inference.gpu_ids", inf.gpu_ids), ("trainer.gpu_ids", cfg.trainer.gpu_ids)):
        if value is not None:
            raise PreflightError(
                f'{key} = {value}: with cluster.backend = "ray", Ray gives each process its GPUs; leave {key} out'
            )
    if inf.colocate_with_trainer:
        raise PreflightError(
            'inference.colocate_with_trainer: with cluster.backend = "ray" each vLLM worker and '
            "trainer rank has a bundle of its own; leave it out"
        )
    if not inf.urls and inf.api_key is None:
        raise PreflightError(
            'inference.api_key is required with cluster.backend = "ray": the vLLM servers lorarl starts '
            "listen on their nodes' addresses, reachable from other machines"
        )
    if not cluster.shared_fs and isinstance(cfg, ServeConfig):
        raise PreflightError(
            "cluster.shared_fs = false: lorarl-serve on Ray needs a run folder that every node mounts at the same "
            "path (vLLM loads each tenant's sampler weights where the trainer writes them); put output_dir there"
        )
    if not cluster.shared_fs and isinstance(cfg, RLConfig) and (auto_resume or cfg.resume is not None):
        raise PreflightError(
            f"{'--resume' if cfg.resume is not None else '--auto_resume'}: with cluster.shared_fs = false the "
            "trainer's checkpoints stay on its node; resume needs a shared run folder (cluster.shared_fs = true)"
        )
    if importlib.util.find_spec("ray") is None:
        raise PreflightError('cluster.backend = "ray", but Ray is not installed here (pip install "ray[default]")')


def warn_single_rollout_groups(cfg: RLConfig) -> None:
    """Groups of one with a custom estimator: legitimate if it needs no group (the config refuses them
    with the built-in estimators), but a baseline from the group would make every advantage 0."""
    orch = cfg.orchestrator
    if orch.rollouts_per_example == 1 and isinstance(orch.advantage, CustomAdvantage):
        log.warning(
            "orchestrator.rollouts_per_example = 1: advantage.fn %r gets one reward per group; an advantage "
            "relative to the group's would be 0 and train nothing",
            orch.advantage.fn,
        )


def check_serve(cfg: ServeConfig, mode: RunMode) -> Placement:
    """Every check of `lorarl-serve @ cfg` run as `mode`; returns where each process goes."""
    check_model(cfg.model.name)
    check_seq_len(cfg.model.name, cfg.seq_len)
    check_cluster(cfg)
    gpus = visible_gpus(mode)
    try:
        for url in cfg.inference.urls:
            check_served_model(url, cfg.model.name, cfg.inference.api_key)
        placement = _placement(cfg, gpus, mode)
    except ValueError as e:  # PlacementError too
        raise PreflightError(str(e)) from None
    check_model_loads(cfg.model, placement.on_gpu)
    if cfg.serve.keys_file is not None:
        from lorarl.serve.auth import keys_in_file

        try:
            keys_in_file(cfg.serve.keys_file)
        except ValueError as e:
            raise PreflightError(str(e)) from None
    check_ports(cfg.serve.host, cfg.serve.port, 1, key="serve.port")
    if not cfg.inference.urls and cfg.cluster.backend == "local":  # Ray's workers listen on their own nodes
        check_ports(cfg.inference.host, cfg.inference.port, cfg.inference.num_workers)
    check_memory(lambda: serve_memory_plan(cfg, placement, mode.device_memory_gib))
    return placement


def check_sft(cfg: SFTConfig, mode: RunMode) -> None:
    check_model(cfg.model.name)
    check_seq_len(cfg.model.name, cfg.seq_len)
    from lorarl.trainer.model import check_init_adapter

    try:
        if cfg.model.lora is not None:
            check_init_adapter(cfg.model.lora)
    except ValueError as e:
        raise PreflightError(str(e)) from None
    check_model_loads(cfg.model, visible_gpus(mode) > 0)
    from lorarl.trainer.sft_data import check_some_trainable, read_sft_data  # loads torch: config valid

    # Every record parses (format, UTF-8, roles, no blank turns, loss tokens, eval apart) and one at
    # least is left something to learn at seq_len: cheap next to training, and a data mistake then stops
    # the run before its folder is touched (DataError). Tokenizing them all waits for the trainer.
    train, _ = read_sft_data(cfg.data)
    if (tokenizer := _tokenizer(cfg.model.name)) is not None:
        check_some_trainable(cfg.data, train, tokenizer, cfg.seq_len)
    check_memory(lambda: sft_memory_plan(cfg, mode))


def check_memory(make_plan: Callable[[], MemoryPlan]) -> None:
    """Every process fits its device by the memory plan (memory_plan.py): else one line naming the keys.
    Counting the adapter wraps the model with PEFT (on the meta device): target modules that adapt
    nothing are found here, not when the trainer starts."""
    try:
        problem = make_plan().problem()
    except AdapterError as e:
        raise PreflightError(str(e)) from None
    if problem is not None:
        raise PreflightError(problem)


def check_model(name: str, key: str = "model.name") -> None:
    """`name` (given as `key`) is a model folder whose config.json parses, with weights and a tokenizer
    that loads, or, where a hub may be reached, a hub id."""
    path = Path(name)  # "~" was expanded with the config
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except OSError as e:  # e.g. a name too long for the file system
        raise PreflightError(f"{key}: {shortened(name)}: {e.strerror}") from None
    if is_dir:
        check_model_folder(path, key)
        return
    if exists:
        raise PreflightError(f"{key}: {name} is a file, not a model folder")
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not _HUB_ID.match(name):
        raise PreflightError(f"{key}: {name} not found (expected a Hugging Face model folder)")


def check_seq_len(name: str, seq_len: int) -> None:
    """seq_len fits the positions the model was built for (max_position_embeddings in its config.json,
    or its text_config's): longer, vLLM refuses to start (--max-model-len) and a trainer would train
    on positions the model never saw. A hub id is not read."""
    config = Path(name) / "config.json"
    if not config.is_file():
        return
    data = _json_object(config, "model.name")
    limit = data.get("max_position_embeddings", (data.get("text_config") or {}).get("max_position_embeddings"))
    if isinstance(limit, int) and seq_len > limit:
        raise PreflightError(
            f"seq_len {seq_len}: {name} handles at most {limit} positions (max_position_embeddings in "
            f"{config}); set seq_len to {limit} or less"
        )


def check_model_folder(path: Path, key: str = "model.name") -> None:
    """What `from_pretrained` needs of a model folder, short of its weights' values: a config.json
    transformers reads, weight files whose headers are whole, and a tokenizer that loads."""
    from transformers import AutoConfig

    config = path / "config.json"
    if not config.is_file():
        raise PreflightError(f"{key}: {path} has no config.json (expected a Hugging Face model folder)")
    _check_layers(config, key)
    try:
        found = AutoConfig.from_pretrained(path)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError... for a bad config.json
        raise PreflightError(f"{key}: {config} is not a model config transformers reads: {_first_line(e)}") from None
    _check_causal_lm(found, config, key)
    model_weights(path, key)
    try:
        tokenizer = _load_tokenizer(str(path))  # cached: check_prompts measures the prompts with it
    except Exception as e:  # as above, for the tokenizer's files
        raise PreflightError(f"{key}: the tokenizer in {path} does not load: {_first_line(e)}") from None
    if getattr(tokenizer, "chat_template", None) is None:
        # transformers builds a tokenizer of one token from a folder with no tokenizer files, and only
        # rendering the first conversation fails (a traceback at start; lorarl-merge wrote it as it was).
        raise PreflightError(
            f"{key}: the tokenizer in {path} has no chat template (no chat_template.jinja, no chat_template in "
            "tokenizer_config.json), which lorarl renders every conversation with: copy the tokenizer files "
            "of the model it came from into that folder"
        )


def _check_layers(config: Path, key: str) -> None:
    """A model of at least one layer (transformers' own check of num_hidden_layers = 0 ends in a
    validator's name, "validate_layer_type", not the key)."""
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return  # AutoConfig's refusal names it
    for where in (data, data.get("text_config") if isinstance(data, dict) else None):
        layers = where.get("num_hidden_layers") if isinstance(where, dict) else None
        if isinstance(layers, int) and not isinstance(layers, bool) and layers < 1:
            raise PreflightError(f"{key}: {config} has num_hidden_layers = {layers}: a model of no layers")


def _check_causal_lm(found: Any, config: Path, key: str) -> None:
    """A model that AutoModelForCausalLM loads as a generator: not an encoder-decoder (T5 was reported
    as an attention implementation) nor a checkpoint of an encoder or a head-less base (BERT's
    BertModel, whose LoRA targets were then reported missing)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    generators = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    architectures = list(getattr(found, "architectures", None) or [])
    generates = not architectures or any(
        a in generators or a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in architectures
    )
    causal = found.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not getattr(found, "is_encoder_decoder", False)
    if not (causal and generates):
        raise PreflightError(
            f"{key}: {config} describes {', '.join(architectures) or found.model_type} (model_type "
            f"{found.model_type!r}), not a causal language model: lorarl trains and serves decoder-only chat models"
        )


def model_weights(path: Path, key: str = "model.name") -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in the model folder's safetensors files, by name (none for pickled
    .bin files, whose shapes cannot be read without loading them); PreflightError if the folder has no
    weights, or a weight file is not whole."""
    for index in sorted(path.glob("*.index.json")):
        named = set(_json_object(index, key).get("weight_map", {}).values())
        if missing := sorted(str(n) for n in named if not (path / str(n)).is_file()):
            raise PreflightError(f"{key}: {index} names weight files that are not there: {', '.join(missing)}")
    shards = sorted(path.glob("*.safetensors"))
    if not shards and not any(path.glob("*.bin")):
        raise PreflightError(f"{key}: {path} has no weights (*.safetensors or *.bin files)")
    return {name: shape for shard in shards for name, shape in safetensors_shapes(shard, key).items()}


def safetensors_shapes(file: Path, key: str) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor in `file` (given as `key`), from its header alone; safetensors also
    checks that the file holds every byte the header declares."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, "pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 (no __iter__)
    except (SafetensorError, OSError) as e:
        raise PreflightError(f"{key}: {file} is not a whole safetensors file ({e})") from None


def _json_object(file: Path, key: str) -> dict[str, Any]:
    try:
        return json_object(file, key)
    except ValueError as e:
        raise PreflightError(str(e)) from None


def check_quantization_here(model: ModelConfig, on_gpu: bool) -> None:
    """model.quantization is one that bitsandbytes can do here: quantize on the CPU (always, for the same
    bytes on every device) and dequantize on the trainer's GPU where this machine has one."""
    if model.quantization == "none":
        return
    import torch

    from lorarl.quantized_base import check_quantization

    devices = ["cpu", *(["cuda"] if on_gpu and torch.cuda.is_available() else [])]
    try:
        for device in devices:
            check_quantization(model, torch.device(device))
    except ValueError as e:
        raise PreflightError(str(e)) from None


def check_model_loads(model: ModelConfig, on_gpu: bool) -> None:
    """What loading the model (and its init adapter) would find, on the meta device: an attention
    implementation the trainer can use here (`on_gpu`: on GPUs), weights of the shapes config.json
    describes, and an init adapter whose tensors fit that model's modules."""
    attn = model.attn_implementation
    if attn in _GPU_ATTENTION and not on_gpu:
        raise PreflightError(
            f"model.attn_implementation = {attn!r} trains on GPUs only, and the trainer runs on the CPU here: "
            "use 'packed_sdpa'"
        )
    check_quantization_here(model, on_gpu)
    found = model_config(model.name)
    if found is None:  # a hub model out of reach: the memory plan says so
        return
    try:
        net = meta_model(found[0], attn)
    except (ImportError, ValueError) as e:  # transformers: an implementation unknown or not installed
        raise PreflightError(f"model.attn_implementation = {attn!r}: {_first_line(e)}") from None
    # Quantized weights are stored packed, in other shapes than the model's.
    if Path(model.name).is_dir() and getattr(found[0], "quantization_config", None) is None:
        _check_weight_shapes(Path(model.name), net)
    if model.lora is not None and model.lora.init_adapter is not None:
        check_adapter_fits(model.lora, net)


def _check_weight_shapes(path: Path, net: Any) -> None:
    """Each tensor both the model and its weight files have has one shape in both (a config.json of
    another model, or one missing its sizes, describes other shapes than the weights')."""
    expected = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    for name, shape in model_weights(path).items():
        if name in expected and expected[name] != shape:
            raise PreflightError(
                f"model.name: the weights in {path} give {name} the shape {list(shape)}, but {path}/config.json "
                f"describes {list(expected[name])}: config.json and the weights are of different models"
            )


def check_adapter_fits(lora: LoraConfig, net: Any) -> None:
    """model.lora.init_adapter's LoRA tensors adapt modules that the base model `net` has, in their
    shapes at the adapter's rank (else PEFT raises a state_dict RuntimeError when loading it)."""
    folder = Path(str(lora.init_adapter))
    file = folder / "adapter_model.safetensors"
    if not file.is_file():
        if (folder / "adapter_model.bin").is_file():
            return  # pickled weights: their shapes cannot be read without loading them
        raise PreflightError(f"model.lora.init_adapter: {folder} has no adapter_model.safetensors")
    # Per-module ranks (PEFT's rank_pattern) differ from r by design: only the base's sides are compared.
    one_rank = not _json_object(folder / "adapter_config.json", "model.lora.init_adapter").get("rank_pattern")
    modules = dict(net.named_modules())
    for name, shape in safetensors_shapes(file, "model.lora.init_adapter").items():
        if (m := _LORA_TENSOR.match(name)) is None:
            continue  # modules_to_save, embedding LoRA: loaded as PEFT sees fit
        module = modules.get(m["module"])
        if module is None:
            raise PreflightError(
                f"model.lora.init_adapter: {file} adapts {m['module']}, which the base model lacks: the adapter "
                "was trained on another model"
            )
        if not hasattr(module, "in_features"):
            continue  # fused expert parameters and the like: PEFT's own layout
        if m["half"] == "A":  # [rank, in_features]
            rank, side, want = shape[0], shape[1:], module.in_features
        else:  # [out_features, rank]
            rank, side, want = shape[-1], shape[:-1], module.out_features
        if side != (want,):
            raise PreflightError(
                f"model.lora.init_adapter: {file} gives {name} the shape {list(shape)}, but the base model's "
                f"{m['module']} takes {want} there: the adapter was trained on another model"
            )
        if one_rank and rank != lora.rank:
            raise PreflightError(
                f"model.lora.init_adapter: {file} holds tensors of rank {rank} ({name}), but its "
                f"adapter_config.json and [model.lora] say {lora.rank}: the adapter folder is inconsistent"
            )


def check_prompts(cfg: RLConfig, user_code: bool) -> None:
    """Each environment's first prompts (and eval prompts) leave room to generate within seq_len:
    an episode whose prompt does not stops the orchestrator mid-run. A user's environment is built
    for it only with `user_code` (a start; check_environments has found it declared)."""
    from lorarl.chat import encode_chat

    orch = cfg.orchestrator
    tokenizer = _tokenizer(cfg.model.name)
    for i, env_cfg in enumerate(orch.env):
        env = _built_environment(i, env_cfg.id, env_cfg.args, user_code)
        if env is None or tokenizer is None:
            continue
        examples = list(islice(env.examples(random.Random(orch.seed)), _PROMPTS_MEASURED))
        if orch.eval is not None:
            examples += islice(env.eval_examples(random.Random(orch.eval.seed)), orch.eval.num_examples)
        prompts = (env.prompt(example) for example in examples)
        template = {"tools": env.tool_schemas(), **orch.chat_template_kwargs}
        longest = max(
            (len(encode_chat(tokenizer, p, add_generation_prompt=True, **template)) for p in prompts), default=0
        )
        if longest >= cfg.seq_len:
            raise PreflightError(
                f"seq_len = {cfg.seq_len}: orchestrator.env[{i}] {env_cfg.id!r} has prompts of {longest} tokens, "
                f"which leave no room to generate: raise seq_len to {longest + orch.sampling.max_tokens} "
                "(the prompt and sampling.max_tokens)"
            )


def _built_environment(i: int, env_id: str, args: dict[str, Any], user_code: bool) -> Environment | None:
    """The environment `env_id` with `args` (the i-th), or None where building it would start a
    library's tools (verifiers) or, without `user_code`, run a user's code."""
    from lorarl.orchestrator import envs

    prefix = env_id.partition(":")[0]
    if prefix in envs.BRIDGES and prefix != "reasoning_gym":
        return None
    if prefix not in envs.BRIDGES and env_id not in envs.BUILTIN and not user_code:
        return None
    try:
        return envs.load_environment(env_id, args)
    except Exception as e:  # an environment's constructor may raise anything: one line that names it
        raise PreflightError(f"orchestrator.env[{i}] id {env_id!r}: building it failed: {_first_line(e)}") from None


def _tokenizer(name: str) -> Any:
    """The model's tokenizer (a folder's was checked by check_model), or a hub model's from the local
    cache; None if not there (a check asks no hub)."""
    try:
        return _load_tokenizer(str(Path(name)))
    except OSError:  # not downloaded yet: vLLM will download it, the orchestrator then finds long prompts
        return None


@functools.cache
def _load_tokenizer(name: str) -> Any:
    """The tokenizer of model folder or hub id `name`, from local files only; loaded once per process."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, local_files_only=True)


def _first_line(error: BaseException) -> str:
    return (str(error).strip() or type(error).__name__).splitlines()[0]


def check_environments(cfg: RLConfig) -> None:
    """Every environment resolves to a declared factory that takes its args (names and types), without
    being built. A user's module is looked up from the working directory, as the orchestrator (started
    there by `rl`) will."""
    if not cfg.orchestrator.env:
        raise PreflightError("[[orchestrator.env]]: no environment given")
    from lorarl.orchestrator.envs import check_environment

    _working_directory_importable()
    for i, env in enumerate(cfg.orchestrator.env):
        try:
            check_environment(env.id, env.args)
        except ArgsError as e:
            raise PreflightError(f"orchestrator.env[{i}].{e}") from None
        except (ValueError, TypeError, ImportError, AttributeError) as e:
            raise PreflightError(f"orchestrator.env[{i}] id {env.id!r}: {e}") from None


def check_algorithms(cfg: RLConfig) -> None:
    """A custom loss or advantage estimator (type "custom") imports, is declared a plugin of its kind and
    takes its `args`, so that a typo stops `rl` now rather than the trainer or orchestrator later, and no
    undeclared function is ever called. Looked up from the working directory, as they (started there by
    `rl`) will."""
    from lorarl.orchestrator.advantages import import_estimator
    from lorarl.trainer.losses import policy_term

    loss, advantage = cfg.trainer.loss, cfg.orchestrator.advantage
    checks = [
        ("trainer.loss", lambda: policy_term(loss)) if isinstance(loss, CustomLoss) else None,
        ("orchestrator.advantage", lambda: import_estimator(advantage))
        if isinstance(advantage, CustomAdvantage)
        else None,
    ]
    for key, check in filter(None, checks):
        _working_directory_importable()
        try:
            check()
        except PluginError as e:
            raise PreflightError(str(e)) from None
        except ArgsError as e:
            raise PreflightError(f"{key}.{e}") from None


def _working_directory_importable() -> None:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # console scripts, unlike `python -m`, leave it out


def check_ports(host: str, port: int, count: int, key: str = "inference.port") -> None:
    """The ports (`key`) of the workers `rl` will start (or `lorarl-serve`'s API) are in range and free."""
    if not 1 <= port <= 65535 - (count - 1):
        raise PreflightError(f"{key}: {port} + {count} workers leaves the range 1..65535")
    for p in range(port, port + count):
        with socket.socket() as s:
            # As vLLM's server binds: the connections of a server that just stopped (TIME_WAIT) do not
            # keep the port from it, only a socket bound there now does.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, p))
            except OSError as e:
                if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:  # no port would do
                    host_key = key.rsplit(".", 1)[0] + ".host"
                    raise PreflightError(
                        f"{host_key}: {host} is not an address of this machine ({e.strerror}): a server started "
                        "here cannot listen there; use 127.0.0.1, 0.0.0.0 or one of this machine's addresses"
                    ) from None
                raise PreflightError(
                    f"{key}: {host}:{p} is not free ({e.strerror}); pick another port"
                    + (", or use the server there with inference.urls" if key == "inference.port" else "")
                ) from None
