"""The work `lorarl-serve`'s trainer process does, and what it answers: the contract between the API
(serve/api.py, which turns the Tinker API's requests into these) and the engine (serve/engine.py, which
holds the base model and every tenant's adapter). Plain picklable dataclasses, as they cross a process
boundary (serve/rpc.py), in the Tinker API's terms: a tenant is a training client's model.

Token alignment is the API's: a datum's `tokens` are the model input x_0..x_{N-1} and `targets[i]` is
the token predicted at position i, so targets are the input shifted by one plus one token more; every
per-target list has N entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class BadRequest(ValueError):
    """A request that cannot be served as given (the client's doing); str() is one line naming the
    field. Anything else the engine raises is the server's own failure."""


@dataclass(frozen=True)
class LoraSpec:
    """A tenant's adapter, as `create_lora_training_client` asks for it."""

    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


@dataclass(frozen=True)
class Datum:
    tokens: list[int]
    targets: list[int]
    weights: list[float] | None = None  # cross_entropy's per-target weights
    advantages: list[float] | None = None
    logprobs: list[float] | None = None  # the sampler's logprob of each target


@dataclass(frozen=True)
class AdamParams:
    """The Tinker API's AdamParams: decoupled weight decay (torch.optim.AdamW); grad_clip_norm 0: none."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass(frozen=True)
class CreateTenant:
    """A fresh adapter for `model_id` on the base model, with an optimizer of its own."""

    model_id: str
    lora: LoraSpec


@dataclass(frozen=True)
class ForwardBackward:
    """Score `data` with the tenant's adapter and, unless `forward_only`, add the gradient of the loss to
    the tenant's (until its next OptimStep). `loss_fn`: a Tinker API name or a lorarl loss type (the same
    registry, trainer/losses.py); `loss_fn_config`: its keys (clip_low_threshold, clip_high_threshold)."""

    model_id: str
    data: tuple[Datum, ...]
    loss_fn: str
    loss_fn_config: dict[str, float] = field(default_factory=dict)
    forward_only: bool = False


@dataclass
class ForwardBackwardResult:
    """Per datum, per target: the logprob under the tenant's adapter and the loss; `metrics` keyed
    "name:reduction" as the SDK combines them ("loss:sum" always)."""

    logprobs: list[list[float]]
    elementwise_loss: list[list[float]]
    metrics: dict[str, float]


@dataclass(frozen=True)
class OptimStep:
    """Apply the tenant's accumulated gradient with `adam`, then clear it."""

    model_id: str
    adam: AdamParams


@dataclass
class OptimStepResult:
    metrics: dict[str, float]  # "grad_norm" (before clipping), "learning_rate"


@dataclass(frozen=True)
class SaveState:
    """The tenant's adapter, optimizer state and LoraSpec to `folder` (created; written whole or not at all)."""

    model_id: str
    folder: Path


@dataclass(frozen=True)
class LoadState:
    """The tenant `model_id` from a SaveState folder: created with its LoraSpec if it is not held, its
    weights replaced, and with `optimizer` its optimizer state (else a fresh optimizer)."""

    model_id: str
    folder: Path
    optimizer: bool


@dataclass(frozen=True)
class SaveForSampler:
    """The tenant's adapter as a PEFT folder vLLM loads (`folder`, written whole or not at all), with the
    served-adapter check's probe (orchestrator/served_check.py)."""

    model_id: str
    folder: Path


@dataclass(frozen=True)
class DropTenant:
    """Free the tenant's adapter and optimizer (what it saved stays on disk)."""

    model_id: str


Op = CreateTenant | ForwardBackward | OptimStep | SaveState | LoadState | SaveForSampler | DropTenant
