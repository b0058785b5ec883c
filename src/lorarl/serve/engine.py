"""`lorarl-serve`'s trainer engine: the base model, loaded once, and every tenant's LoRA adapter on it,
each with an AdamW optimizer of its own, running the operations of ops.py one at a time.

Tenants are adapters of one PEFT model, as rl's [[variants]] are (trainer/variants.py): PEFT's
`set_adapter` makes a tenant's adapter the only one in the forward pass and the only one that
requires grad, so its backward pass reaches its weights alone. Its gradient stays on its parameters
from one ForwardBackward to the next, whatever other tenants do in between, until its OptimStep; its
optimizer holds its parameters alone. Given the same requests, a tenant ends with the adapter it would
have if it were the only one (tests/unit/serve/test_engine.py).

The adapter a tenant asks for (`LoraSpec`):
* train_attn puts LoRA on q/k/v/o_proj, train_mlp on gate/up/down_proj; one of them is required.
* train_unembed is accepted and ignored: vLLM 0.32 cannot serve LoRA on the output head (lm_head) the
  way lorarl hands adapters to it, and `rl` does not train it either; the API tells the client so.
* lora_alpha is 32 at every rank (scale 32 / rank), as Thinking Machines' "LoRA Without Regret"
  states for Tinker ("we use alpha = 32") and tinker-cookbook's learning-rate helper assumes
  (hyperparam_utils: lora_alpha = 32); neither the SDK nor the API says it, so this follows the
  published recipe, with which a client's cookbook learning rates mean what they mean on Tinker.
* The initial weights are drawn from LoraSpec.seed, or else from a seed derived from `seed` and the
  model id; B = 0, so a fresh adapter is exactly the base model.

Losses (ForwardBackward.loss_fn) are lorarl's registry (trainer/losses.py): Tinker's cross_entropy,
importance_sampling, ppo and cispo are the lorarl types of the same name, with Tinker's keys and
defaults (clip_low_threshold 0.8 and clip_high_threshold 1.2, the ratio range [low, high]); every
other built-in type (mask) with its own keys. Tinker sums the loss over targets and datums, so the
norm is the constant 1. cross_entropy's per-target weights are its advantages (-A log pi). Tinker's
dro, gspo, stable_reinforce and server-side custom losses are refused.

Token layout: a datum's `tokens` x_0..x_{N-1} and `targets` t_0..t_{N-1}, where t_i is the token after
x_i; lorarl serves the shifted layout only (t_i = x_{i+1} for i < N-1), the one every Tinker recipe
sends, so a datum is the sample x_0..x_{N-1} t_{N-1} with a loss on each of its N targets.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast, overload

import peft
import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PreTrainedModel

from lorarl.config.algorithms import LOSS_TYPES, LossBase
from lorarl.config.model import LoraConfig
from lorarl.config.serve import ServeConfig
from lorarl.cpu.host_memory import set_host_malloc
from lorarl.run_folder import RunFolderError, write_folder_atomically
from lorarl.serve.ops import (
    AdamParams,
    BadRequest,
    CreateTenant,
    Datum,
    DropTenant,
    ForwardBackward,
    ForwardBackwardResult,
    LoadState,
    LoraSpec,
    Op,
    OptimStep,
    OptimStepResult,
    SaveForSampler,
    SaveState,
)
from lorarl.trainer.batching import MicroBatch, TrainSample
from lorarl.trainer.broadcast import write_policy
from lorarl.trainer.distributed import DataParallel, init_data_parallel
from lorarl.trainer.loss import LossNorm, micro_batch_scores
from lorarl.trainer.losses import BUILTIN
from lorarl.trainer.model import (
    apply_lora,
    check_vllm_can_serve,
    enable_gradient_checkpointing,
    load_model,
    save_adapter,
)
from lorarl.trainer.packing import ForwardPasses, PackedBatch
from lorarl.trainer.served_probe import attach_probe
from lorarl.trainer.update_watch import largest_weight
from lorarl.written_files import manifest_problem

log = logging.getLogger("lorarl.serve.engine")

LORA_ALPHA = 32.0  # at every rank: module docstring
ATTN_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]
# Tinker's loss names and their keys with Tinker's defaults; the lorarl types of the same names take these.
TINKER_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
TINKER_LOSS_KEYS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": TINKER_CLIP,
    "cispo": TINKER_CLIP,
}
# A SaveState folder: a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) and these.
STATE_FILE = "lorarl_serve_state.json"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FORMAT = "lorarl-serve-state/1"


@dataclass
class Tenant:
    """A training client's adapter in the shared PEFT model, and its optimizer."""

    model_id: str
    adapter: str  # its PEFT adapter name (`adapter_name`)
    lora: LoraSpec
    params: list[torch.nn.Parameter]  # its weights, in the model's order (the optimizer's too)
    optimizer: torch.optim.AdamW


@dataclass(frozen=True)
class LossChoice:
    """What a ForwardBackward's loss_fn and loss_fn_config make: the lorarl loss section and the datum
    fields the loss reads (cross_entropy's weights go where the others' advantages go)."""

    cfg: LossBase
    advantages_field: str  # "weights" or "advantages"
    needs_logprobs: bool


class Engine:
    """The trainer process's state: the base model with every tenant's adapter (module docstring)."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        dp = init_data_parallel(cfg.trainer.parallel)  # one process (ServeConfig: dp = 1)
        self.device = dp.device()
        set_host_malloc(self.device.type == "cpu", cfg.keep_freed_memory)
        if cfg.trainer.num_threads is not None:
            torch.set_num_threads(cfg.trainer.num_threads)
        torch.manual_seed(cfg.seed)
        base = load_model(cfg.model)
        dp.place(base)
        if cfg.trainer.gradient_checkpointing:
            enable_gradient_checkpointing(base)
        # The PEFT model once the first tenant comes (PEFT wraps a model with its first adapter); it
        # stays, with no adapter, when the last one goes.
        self.model: PreTrainedModel | peft.PeftModel = base
        self.vocab_size = cast(torch.nn.Embedding, base.get_input_embeddings()).num_embeddings
        pad_id = base.config.pad_token_id or 0
        # Datums of one request are no GRPO group: no prompts to share.
        self.passes = ForwardPasses(cfg.trainer.packing, cfg.seq_len, cfg.trainer.micro_batch_size, pad_id)
        self.tenants: dict[str, Tenant] = {}
        self._adapters_made = 0
        log.info("base model %s loaded on %s", cfg.model.name, self.device)

    @overload
    def run(self, op: ForwardBackward) -> ForwardBackwardResult: ...
    @overload
    def run(self, op: OptimStep) -> OptimStepResult: ...
    @overload
    def run(self, op: CreateTenant | SaveState | LoadState | SaveForSampler | DropTenant) -> None: ...
    def run(self, op: Op) -> ForwardBackwardResult | OptimStepResult | None:
        """Carry out `op` (ops.py says what each does); BadRequest, one line naming the field, where the
        request cannot be served, with nothing changed."""
        if isinstance(op, CreateTenant):
            self._create(op.model_id, op.lora)
            return None
        if isinstance(op, ForwardBackward):
            return self._forward_backward(op)
        if isinstance(op, OptimStep):
            return self._optim_step(op)
        if isinstance(op, LoadState):
            self._load_state(op)
            return None
        try:
            if isinstance(op, SaveState):
                self._save_state(op)
                return None
            if isinstance(op, SaveForSampler):
                write_policy(self._activate(self._tenant(op.model_id)), op.folder)
                return None
        except RunFolderError as e:  # a file of someone else's where the folder goes: nothing replaced
            raise BadRequest(f"path: {e}") from None
        if isinstance(op, DropTenant):
            self._drop(self._tenant(op.model_id))
            return None
        raise TypeError(f"not an operation of serve/ops.py: {type(op).__name__}")

    # --- tenants -------------------------------------------------------------------------------------

    def _tenant(self, model_id: str) -> Tenant:
        tenant = self.tenants.get(model_id)
        if tenant is None:
            raise BadRequest(f"model_id {model_id!r}: no such model on the trainer (unloaded, or never created)")
        return tenant

    def _activate(self, tenant: Tenant) -> peft.PeftModel:
        """The PEFT model with `tenant`'s adapter the one that runs and trains."""
        model = self.model
        assert isinstance(model, peft.PeftModel)  # a tenant exists
        if model.active_adapter != tenant.adapter:
            model.set_adapter(tenant.adapter)
        return model

    def _create(self, model_id: str, lora: LoraSpec) -> Tenant:
        if model_id in self.tenants:
            raise BadRequest(f"model_id {model_id!r}: already created")
        check_lora(lora, self.cfg.serve.max_rank)
        if len(self.tenants) >= self.cfg.serve.max_tenants:
            raise BadRequest(
                f"the trainer holds {len(self.tenants)} training clients, serve.max_tenants: save and close one "
                "(or wait for an idle one to be unloaded) before creating another"
            )
        self._adapters_made += 1
        name = adapter_name(model_id, self._adapters_made)
        targets = [*(ATTN_MODULES if lora.train_attn else []), *(MLP_MODULES if lora.train_mlp else [])]
        seed = lora.seed if lora.seed is not None else derived_seed(self.cfg.seed, model_id)
        first = not isinstance(self.model, peft.PeftModel)
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):  # the initial weights follow the seed alone
            torch.manual_seed(seed)
            lora_cfg = LoraConfig(rank=lora.rank, alpha=LORA_ALPHA, target_modules=targets)
            self.model = apply_lora(self.model, lora_cfg, name)
        model = self.model
        check_vllm_can_serve(model)
        if first:
            attach_probe(model, self.cfg)  # every SaveForSampler carries the served-adapter check's probe
        model.set_adapter(name)
        params = [p for n, p in model.named_parameters() if f".{name}." in n]
        tenant = Tenant(model_id, name, lora, params, torch.optim.AdamW(params))
        self.tenants[model_id] = tenant
        log.info("%s: LoRA rank %d on %s (adapter %s, seed %d)", model_id, lora.rank, ", ".join(targets), name, seed)
        return tenant

    def _drop(self, tenant: Tenant) -> None:
        model = self.model
        assert isinstance(model, peft.PeftModel)
        model.delete_adapter(tenant.adapter)
        del self.tenants[tenant.model_id]
        log.info("%s: unloaded", tenant.model_id)

    # --- forward / backward --------------------------------------------------------------------------

    def _forward_backward(self, op: ForwardBackward) -> ForwardBackwardResult:
        tenant = self._tenant(op.model_id)
        loss = loss_choice(op.loss_fn, op.loss_fn_config)
        if not op.data:
            raise BadRequest("data: no datum")
        samples = [train_sample(i, d, loss, self.vocab_size, self.cfg.seq_len) for i, d in enumerate(op.data)]
        where = {id(s): i for i, s in enumerate(samples)}
        model = self._activate(tenant)
        model.train()
        norm = LossNorm.for_step(loss.cfg, samples)
        logprobs: list[list[float]] = [[] for _ in samples]
        losses: list[list[float]] = [[] for _ in samples]
        with torch.set_grad_enabled(not op.forward_only):
            for batch_samples, batch in self.passes.split_with_samples(samples):
                batch = batch.to(self.device)
                lp, token_loss, _ = micro_batch_scores(model, batch, loss.cfg, norm, self.cfg.trainer.logits_chunk_size)
                if not op.forward_only:
                    token_loss.sum().backward()
                for sample, sample_lp, sample_loss in zip(
                    batch_samples, *per_sample_targets(batch, lp, token_loss), strict=True
                ):
                    logprobs[where[id(sample)]] = sample_lp
                    losses[where[id(sample)]] = sample_loss
        # A plain sum: fsum refuses inf - inf, and a non-finite loss is the client's to see.
        return ForwardBackwardResult(logprobs, losses, {"loss:sum": sum(x for row in losses for x in row)})

    # --- optimizer step ------------------------------------------------------------------------------

    def _optim_step(self, op: OptimStep) -> OptimStepResult:
        tenant = self._tenant(op.model_id)
        adam = check_adam(op.adam)
        params, optimizer = tenant.params, tenant.optimizer
        max_norm = adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise BadRequest(
                f"model_id {op.model_id!r}: the accumulated gradient is NaN or infinite (a non-finite loss: check "
                "the data's logprobs and advantages): no weight changed, and the gradient was discarded"
            )
        for group in optimizer.param_groups:
            group.update(
                lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay
            )
        # Kept to undo an update that makes a weight non-finite (no adapter is ever saved from such weights),
        # or that stopped half-way (a hyper-parameter that overflows the weights' dtype).
        before = ([p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict()))
        try:
            optimizer.step()
            problem = None if math.isfinite(float(largest_weight(params, DataParallel()))) else "NaN or infinite"
        except RuntimeError as e:
            if "overflow" not in str(e):
                self._restore(tenant, *before)
                raise
            problem = f"overflow ({e})"
        optimizer.zero_grad(set_to_none=True)
        if problem is not None:
            self._restore(tenant, *before)
            raise BadRequest(
                f"adam_params: the update made the adapter's weights {problem} (learning_rate {adam.learning_rate:g}, "
                f"eps {adam.eps:g}, weight_decay {adam.weight_decay:g}); no weight changed, and the gradient was "
                "discarded"
            )
        return OptimStepResult({"grad_norm": grad_norm, "learning_rate": adam.learning_rate})

    def _restore(self, tenant: Tenant, weights: list[torch.Tensor], optimizer_state: dict[str, Any]) -> None:
        with torch.no_grad():
            for p, saved in zip(tenant.params, weights, strict=True):
                p.copy_(saved)
        tenant.optimizer.load_state_dict(optimizer_state)

    # --- saved states --------------------------------------------------------------------------------

    def _save_state(self, op: SaveState) -> None:
        tenant = self._tenant(op.model_id)
        model = self._activate(tenant)
        state = {"format": STATE_FORMAT, "model_id": tenant.model_id, "base_model": self.cfg.model.name}

        def write(tmp: Path) -> None:
            save_adapter(model, tmp)
            torch.save(tenant.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
            (tmp / STATE_FILE).write_text(json.dumps({**state, "lora": asdict(tenant.lora)}, indent=1))

        write_folder_atomically(op.folder, write, checksums=True)

    def _load_state(self, op: LoadState) -> None:
        lora, weights, optimizer_state = read_state(op.folder)
        tenant = self.tenants.get(op.model_id)
        created = tenant is None
        if tenant is None:
            tenant = self._create(op.model_id, lora)
        elif shape(tenant.lora) != shape(lora):
            raise BadRequest(
                f"path: {op.folder.name} holds a {shape(lora)} adapter, model {op.model_id!r} is a "
                f"{shape(tenant.lora)} one: load it into a new training client"
            )
        try:
            self._set_weights(tenant, weights, op.folder)
            optimizer = torch.optim.AdamW(tenant.params)
            if op.optimizer:
                try:
                    optimizer.load_state_dict(optimizer_state)
                except (ValueError, KeyError) as e:
                    raise BadRequest(f"path: {op.folder.name}/{OPTIMIZER_FILE} does not fit the adapter: {e}") from None
        except BaseException:
            if created:
                self._drop(tenant)  # a load that failed leaves no tenant behind
            raise
        tenant.optimizer = optimizer
        for p in tenant.params:
            p.grad = None  # the gradient of weights that are gone
        log.info("%s: loaded %s%s", op.model_id, op.folder, " with its optimizer state" if op.optimizer else "")

    def _set_weights(self, tenant: Tenant, weights: dict[str, torch.Tensor], folder: Path) -> None:
        model = self._activate(tenant)
        want = peft.get_peft_model_state_dict(model, adapter_name=tenant.adapter)
        if weights.keys() != want.keys() or any(weights[k].shape != want[k].shape for k in want):
            raise BadRequest(f"path: {folder.name}: its adapter weights do not fit a rank-{tenant.lora.rank} adapter")
        peft.set_peft_model_state_dict(model, weights, adapter_name=tenant.adapter)


# --- requests ----------------------------------------------------------------------------------------


def adapter_name(model_id: str, number: int) -> str:
    """A PEFT adapter name for `model_id`: an identifier, unique in the process (`number`), that is no
    part of PEFT's "lora_" names (trainer/variants.py)."""
    return f"tenant{number}_" + re.sub(r"\W", "_", model_id, flags=re.ASCII)[:64]


def derived_seed(seed: int, model_id: str) -> int:
    """The initial-weight seed of a tenant that gave none: the same for the same server seed and model id."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{model_id}".encode()).digest()[:8], "big") >> 1


def shape(lora: LoraSpec) -> str:
    """What makes two adapters hold the same weights: rank and targets."""
    targets = [name for name, on in (("attn", lora.train_attn), ("mlp", lora.train_mlp)) if on]
    return f"rank-{lora.rank} {'+'.join(targets)}"


def check_lora(lora: LoraSpec, max_rank: int) -> None:
    if not 1 <= lora.rank <= max_rank:
        raise BadRequest(f"rank {lora.rank}: this server serves ranks 1 to {max_rank} (serve.max_rank)")
    if lora.seed is not None and not 0 <= lora.seed < 2**63:
        raise BadRequest(f"seed {lora.seed}: 0 to 2**63 - 1")
    if not (lora.train_attn or lora.train_mlp):
        raise BadRequest(
            "train_attn and train_mlp are both false: lorarl trains LoRA on the attention and MLP projections, "
            "not on the output head (train_unembed) alone"
        )


def check_adam(adam: AdamParams) -> AdamParams:
    """`adam` if every field is in range; BadRequest naming the first that is not."""
    rules = {
        "learning_rate": adam.learning_rate >= 0,
        "beta1": 0 <= adam.beta1 < 1,
        "beta2": 0 <= adam.beta2 < 1,
        "eps": adam.eps >= 0,
        "weight_decay": adam.weight_decay >= 0,
        "grad_clip_norm": adam.grad_clip_norm >= 0,
    }
    for name, ok in rules.items():
        value = getattr(adam, name)
        if not (ok and math.isfinite(value)):
            raise BadRequest(f"adam_params.{name}: {value!r} is out of range")
    return adam


def loss_choice(loss_fn: str, config: dict[str, float]) -> LossChoice:
    """The lorarl loss that `loss_fn` and its `config` name (module docstring); BadRequest naming what
    is not served."""
    if loss_fn not in BUILTIN:
        raise BadRequest(
            f"loss_fn {loss_fn!r} is not served here: one of {', '.join(sorted(BUILTIN))} "
            "(forward_backward_custom works with any of them)"
        )
    tinker = TINKER_LOSS_KEYS.get(loss_fn)
    loss_type = LOSS_TYPES[loss_fn]
    own = set(loss_type.model_fields) - set(LossBase.model_fields) - {"type"}
    keys = list(tinker) if tinker is not None else sorted(own)
    for key, value in config.items():
        if key not in keys:
            takes = f"its keys: {', '.join(keys)}" if keys else "it takes none"
            raise BadRequest(f"loss_fn_config.{key}: not a key of loss_fn {loss_fn!r} ({takes})")
        if isinstance(value, float | int) and not math.isfinite(value):
            raise BadRequest(f"loss_fn_config.{key}: {value!r} is not a finite number")
    args: dict[str, Any] = dict(config)
    if tinker is not None:
        args = {}
        if tinker:
            low = config.get("clip_low_threshold", tinker["clip_low_threshold"])
            high = config.get("clip_high_threshold", tinker["clip_high_threshold"])
            if not 0 <= low <= 1:
                raise BadRequest(f"loss_fn_config.clip_low_threshold: {low!r}: the ratio's lower bound, 0 to 1")
            if high < 1:
                raise BadRequest(f"loss_fn_config.clip_high_threshold: {high!r}: the ratio's upper bound, at least 1")
            args = {"ratio_low": 1 - low, "ratio_high": high - 1}
    try:
        cfg = loss_type(norm="constant", norm_constant=1.0, **args)
    except ValidationError as e:
        error = e.errors()[0]
        key = ".".join(str(part) for part in error["loc"])
        raise BadRequest(f"loss_fn_config.{key}: {error['msg']}") from None
    cross_entropy = loss_fn == "cross_entropy"
    return LossChoice(cfg, "weights" if cross_entropy else "advantages", needs_logprobs=not cross_entropy)


def train_sample(i: int, datum: Datum, loss: LossChoice, vocab_size: int, seq_len: int) -> TrainSample:
    """Datum `data[i]` as a lorarl sample (module docstring: "Token layout"), checked: BadRequest naming
    the field that cannot be served."""
    where = f"data[{i}]"
    n = len(datum.tokens)
    if n == 0:
        raise BadRequest(f"{where}.tokens: empty")
    if len(datum.targets) != n:
        raise BadRequest(f"{where}.targets: {len(datum.targets)} targets for {n} tokens: one target per token")
    if n + 1 > seq_len:
        raise BadRequest(f"{where}.tokens: {n} tokens and the last target make {n + 1}, more than seq_len {seq_len}")
    for field, ids in (("tokens", datum.tokens), ("targets", datum.targets)):
        if (j := next((j for j, t in enumerate(ids) if not 0 <= t < vocab_size), None)) is not None:
            raise BadRequest(f"{where}.{field}[{j}]: {ids[j]} is not a token of the model (0 to {vocab_size - 1})")
    if (j := next((j for j in range(n - 1) if datum.targets[j] != datum.tokens[j + 1]), None)) is not None:
        raise BadRequest(
            f"{where}.targets[{j}] is {datum.targets[j]} but tokens[{j + 1}] is {datum.tokens[j + 1]}: lorarl-serve "
            "takes targets shifted by one (targets[i] is tokens[i + 1], and the last target follows the last token)"
        )
    advantages = per_target(where, loss.advantages_field, getattr(datum, loss.advantages_field), n)
    logprobs = per_target(where, "logprobs", datum.logprobs, n) if loss.needs_logprobs else [0.0] * n
    return TrainSample(
        input_ids=[*datum.tokens, datum.targets[-1]],
        loss_mask=[False] + [True] * n,  # the first token is no prediction; every target is
        old_logprobs=[0.0, *logprobs],
        token_advantages=[0.0, *advantages],
    )


def per_target(where: str, field: str, values: Sequence[float] | None, n: int) -> list[float]:
    if values is None:
        raise BadRequest(f"{where}.{field}: missing (this loss_fn needs it)")
    if len(values) != n:
        raise BadRequest(f"{where}.{field}: {len(values)} values for {n} targets: one per target")
    if (j := next((j for j, v in enumerate(values) if not math.isfinite(v)), None)) is not None:
        raise BadRequest(f"{where}.{field}[{j}]: {values[j]!r} is not a finite number")
    return [float(v) for v in values]


def per_sample_targets(batch: MicroBatch | PackedBatch, *values: torch.Tensor) -> list[list[list[float]]]:
    """Per tensor of `values` ([rows, T-1], per target), each of the batch's samples' loss-token values in
    order, by `sample_index`: [tensor][sample][target]."""
    mask = batch.loss_mask
    index = batch.sample_index[mask]
    order = torch.argsort(index, stable=True)
    counts = torch.bincount(index, minlength=batch.num_samples).tolist()
    return [[part.tolist() for part in v.detach()[mask][order].float().cpu().split(counts)] for v in values]


def read_state(folder: Path) -> tuple[LoraSpec, dict[str, torch.Tensor], dict[str, Any]]:
    """A SaveState folder's LoRA spec, adapter weights and optimizer state, whole and finite; BadRequest
    naming `path` if it is not one."""
    name = f"path: {folder.name}"
    if not (folder / STATE_FILE).is_file():
        raise BadRequest(f"{name} is not a saved training state (save_state writes one)")
    if (problem := manifest_problem(folder)) is not None:
        raise BadRequest(f"{name} is damaged: {problem}")
    try:
        state = json.loads((folder / STATE_FILE).read_text())
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"format {state.get('format')!r}, not {STATE_FORMAT!r}")
        lora = LoraSpec(**state["lora"])
        weights = load_file(folder / "adapter_model.safetensors")
        optimizer_state = torch.load(folder / OPTIMIZER_FILE, weights_only=True, map_location="cpu")
    except (OSError, ValueError, KeyError, TypeError, SafetensorError, RuntimeError) as e:
        raise BadRequest(f"{name} is not a saved training state this server reads: {e}") from None
    if bad := next((k for k, w in weights.items() if not torch.isfinite(w).all()), None):
        raise BadRequest(f"{name}: its weight {bad} is NaN or infinite")
    return lora, weights, optimizer_state
