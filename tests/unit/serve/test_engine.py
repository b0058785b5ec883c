"""lorarl-serve's trainer engine on the tiny model with real PEFT: each loss against a direct computation
with a plain PEFT model, gradients that accumulate until the optimizer step, AdamW against torch's run
by hand, tenants that never touch each other, saved states, sampler folders, and bad requests that name
their field and change nothing."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM

from lorarl.config.serve import ServeConfig
from lorarl.run_folder import PROBE_FILE
from lorarl.serve.engine import LORA_ALPHA, Engine
from lorarl.serve.ops import (
    AdamParams,
    BadRequest,
    CreateTenant,
    Datum,
    DropTenant,
    ForwardBackward,
    LoadState,
    LoraSpec,
    OptimStep,
    SaveForSampler,
    SaveState,
)
from lorarl.written_files import STABLE

ID = "s000000000001:train:0"


def engine(tiny_model: Path, out: Path, **keys: Any) -> Engine:
    trainer = {"micro_batch_size": 2, **keys.pop("trainer", {})}  # two rows a pass: several passes per request
    return Engine(ServeConfig(model={"name": str(tiny_model)}, output_dir=out, seq_len=64, trainer=trainer, **keys))


def datums(n: int, seed: int, vocab: int = 259) -> list[Datum]:
    """`n` datums of 4 to 12 tokens, targets shifted by one, every per-target input filled."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        seq = [rng.randrange(3, vocab) for _ in range(rng.randrange(5, 14))]
        m = len(seq) - 1
        out.append(Datum(tokens=seq[:-1], targets=seq[1:], weights=[rng.uniform(-1, 2) for _ in range(m)],
                         advantages=[rng.uniform(-1, 1) for _ in range(m)],
                         logprobs=[-rng.uniform(3, 8) for _ in range(m)]))  # fmt: skip
    return out


def adapter_weights(e: Engine, model_id: str) -> dict[str, torch.Tensor]:
    tenant = e.tenants[model_id]
    assert isinstance(e.model, peft.PeftModel)
    weights = peft.get_peft_model_state_dict(e.model, adapter_name=tenant.adapter)
    return {k: v.detach().cpu().clone() for k, v in weights.items()}


def grads(e: Engine, model_id: str) -> dict[str, torch.Tensor]:
    """The tenant's accumulated gradient, by parameter name without its adapter name."""
    tenant = e.tenants[model_id]
    assert isinstance(e.model, peft.PeftModel)
    return {
        n.replace(f".{tenant.adapter}.", "."): p.grad.cpu().clone()
        for n, p in e.model.named_parameters()
        if f".{tenant.adapter}." in n and p.grad is not None
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tol: float) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k, **tol)


def plain_copy(e: Engine, model_id: str, folder: Path, tiny_model: Path) -> peft.PeftModel:
    """The tenant's adapter on a base model of its own, through the SaveForSampler folder, with PEFT alone."""
    e.run(SaveForSampler(model_id, folder))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    return peft.PeftModel.from_pretrained(base, str(folder), is_trainable=True)


def direct_logprobs(model: torch.nn.Module, d: Datum) -> torch.Tensor:
    logits = model(input_ids=torch.tensor([d.tokens])).logits[0].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(d.targets)[:, None])[:, 0]


def direct_loss(loss_fn: str, lp: torch.Tensor, d: Datum, low: float = 0.8, high: float = 1.2) -> torch.Tensor:
    """Tinker's per-target loss (tinker_spec.md 6.2), written out."""
    if loss_fn == "cross_entropy":
        return -lp * torch.tensor(d.weights)
    adv, ratio = torch.tensor(d.advantages), torch.exp(lp - torch.tensor(d.logprobs))
    if loss_fn == "importance_sampling":
        return -ratio * adv
    if loss_fn == "ppo":
        return -torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    assert loss_fn == "cispo"
    return -ratio.clamp(low, high).detach() * lp * adv


def trained(e: Engine, model_id: str, seed: int = 7) -> None:
    """One step, so that the adapter is no longer the base model (B = 0) and both A and B get gradients."""
    e.run(ForwardBackward(model_id, tuple(datums(3, seed)), "cross_entropy"))
    e.run(OptimStep(model_id, AdamParams(learning_rate=1e-2)))


@pytest.mark.parametrize(
    ("loss_fn", "config", "packing"),
    [
        ("cross_entropy", {}, True),
        ("cross_entropy", {}, False),
        ("importance_sampling", {}, True),
        ("ppo", {}, True),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}, True),
        ("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}, True),
    ],
)
def test_each_loss_gives_the_loss_and_gradient_of_a_direct_computation(
    tiny_model: Path, tmp_path: Path, loss_fn: str, config: dict[str, float], packing: bool
) -> None:
    e = engine(tiny_model, tmp_path, trainer={"packing": packing})
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    trained(e, ID)
    plain = plain_copy(e, ID, tmp_path / "plain", tiny_model)
    data = datums(5, seed=11)
    # The sampler's logprobs near the model's own, so that some ratios leave the clip range and some do not.
    rng = random.Random(0)
    with torch.no_grad():
        own = [direct_logprobs(plain, d) for d in data]
    data = [Datum(d.tokens, d.targets, d.weights, d.advantages, [x + rng.uniform(-0.3, 0.3) for x in lp.tolist()])
            for d, lp in zip(data, own, strict=True)]  # fmt: skip

    result = e.run(ForwardBackward(ID, tuple(data), loss_fn, config))

    low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    total = torch.zeros(())
    for i, d in enumerate(data):
        lp = direct_logprobs(plain, d)
        loss = direct_loss(loss_fn, lp, d, low, high)
        torch.testing.assert_close(torch.tensor(result.logprobs[i]), lp.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(result.elementwise_loss[i]), loss.detach(), atol=1e-5, rtol=1e-5)
        total = total + loss.sum()
    total.backward()
    assert set(result.metrics) == {"loss:sum"}
    assert result.metrics["loss:sum"] == pytest.approx(total.item(), rel=1e-5, abs=1e-5)
    expected = {n.replace(".default.", "."): p.grad for n, p in plain.named_parameters() if p.grad is not None}
    assert_same(grads(e, ID), expected, atol=1e-5, rtol=1e-4)


def test_importance_sampling_on_its_own_logprobs_is_reinforce(tiny_model: Path, tmp_path: Path) -> None:
    e = engine(tiny_model, tmp_path)
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    trained(e, ID)
    data = datums(4, seed=5)
    own = e.run(ForwardBackward(ID, tuple(data), "cross_entropy", forward_only=True)).logprobs
    data = [Datum(d.tokens, d.targets, advantages=d.advantages, logprobs=lp) for d, lp in zip(data, own, strict=True)]
    result = e.run(ForwardBackward(ID, tuple(data), "importance_sampling"))
    is_grads = grads(e, ID)
    assert result.metrics["loss:sum"] == pytest.approx(-sum(sum(d.advantages or []) for d in data), rel=1e-5)

    reinforce = engine(tiny_model, tmp_path / "reinforce")
    reinforce.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    trained(reinforce, ID)
    weighted = [Datum(d.tokens, d.targets, weights=d.advantages) for d in data]  # -A log pi
    reinforce.run(ForwardBackward(ID, tuple(weighted), "cross_entropy"))
    assert_same(is_grads, grads(reinforce, ID), atol=1e-6, rtol=1e-4)


def test_forward_only_changes_nothing(tiny_model: Path, tmp_path: Path) -> None:
    e = engine(tiny_model, tmp_path)
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    trained(e, ID)
    before = adapter_weights(e, ID)
    data = tuple(datums(3, seed=2))
    forward = e.run(ForwardBackward(ID, data, "ppo", forward_only=True))
    assert grads(e, ID) == {}
    step = e.run(OptimStep(ID, AdamParams(learning_rate=1e-2)))
    assert step.metrics["grad_norm"] == 0.0
    assert_same(adapter_weights(e, ID), before, atol=0.0, rtol=0.0)
    backward = e.run(ForwardBackward(ID, data, "ppo"))
    assert forward.logprobs == backward.logprobs and forward.metrics == backward.metrics


def test_gradients_accumulate_over_calls_until_the_optimizer_step(tiny_model: Path, tmp_path: Path) -> None:
    one, two = datums(2, seed=4)
    split = engine(tiny_model, tmp_path / "split")
    split.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    trained(split, ID)
    split.run(ForwardBackward(ID, (one,), "importance_sampling"))
    split.run(ForwardBackward(ID, (two,), "importance_sampling"))
    split_norm = split.run(OptimStep(ID, AdamParams(learning_rate=1e-2))).metrics["grad_norm"]

    whole = engine(tiny_model, tmp_path / "whole")
    whole.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    trained(whole, ID)
    whole.run(ForwardBackward(ID, (one, two), "importance_sampling"))
    assert whole.run(OptimStep(ID, AdamParams(learning_rate=1e-2))).metrics["grad_norm"] == pytest.approx(
        split_norm, rel=1e-5
    )
    assert_same(adapter_weights(split, ID), adapter_weights(whole, ID), atol=1e-6, rtol=1e-5)


def test_optim_step_is_torch_adamw_with_the_requests_hyperparameters(tiny_model: Path, tmp_path: Path) -> None:
    e = engine(tiny_model, tmp_path)
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    params = e.tenants[ID].params
    copies = [p.detach().clone().requires_grad_(True) for p in params]
    by_hand = torch.optim.AdamW(copies)
    steps = [
        AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-8, weight_decay=0.1, grad_clip_norm=0.5),
        AdamParams(learning_rate=3e-3, weight_decay=0.0),  # the SDK's defaults otherwise
    ]
    for k, adam in enumerate(steps):
        e.run(ForwardBackward(ID, tuple(datums(3, seed=k)), "cross_entropy"))
        gradient = [p.grad.clone() for p in params]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gradient])).item()
        metrics = e.run(OptimStep(ID, adam)).metrics
        assert metrics == {"grad_norm": pytest.approx(norm, rel=1e-5), "learning_rate": adam.learning_rate}
        scale = min(1.0, adam.grad_clip_norm / (norm + 1e-6)) if adam.grad_clip_norm > 0 else 1.0
        assert k > 0 or scale < 1  # the first step really clips
        for c, g in zip(copies, gradient, strict=True):
            c.grad = g * scale
        for group in by_hand.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)  # fmt: skip
        by_hand.step()
        for p, c in zip(params, copies, strict=True):
            torch.testing.assert_close(p.detach(), c.detach(), atol=1e-7, rtol=1e-6)
        assert all(p.grad is None for p in params)  # cleared by the step


def test_tenants_interleaved_train_the_adapters_they_would_train_alone(tiny_model: Path, tmp_path: Path) -> None:
    specs = {
        "a": LoraSpec(rank=4, seed=1),
        "b": LoraSpec(rank=8, seed=2, train_mlp=False),
        "c": LoraSpec(rank=2, seed=3, train_attn=False, train_unembed=False),
    }
    losses = {"a": "cross_entropy", "b": "ppo", "c": "cispo"}

    def ops(name: str) -> list[Any]:
        """Tenant `name`'s requests: three steps, the second of two forward_backward calls."""
        out: list[Any] = []
        for step in range(3):
            for call in range(1 + (step == 1)):
                data = tuple(datums(2, seed=100 * ord(name) + 10 * step + call))
                out.append(ForwardBackward(name, data, losses[name]))
            out.append(OptimStep(name, AdamParams(learning_rate=1e-2 * (step + 1))))
        return out

    shared = engine(tiny_model, tmp_path / "shared")
    for name, spec in specs.items():
        shared.run(CreateTenant(name, spec))
    queues = {name: ops(name) for name in specs}
    while any(queues.values()):  # round robin: every tenant's calls between every other's
        for queue in queues.values():
            if queue:
                shared.run(queue.pop(0))

    for name, spec in specs.items():
        alone = engine(tiny_model, tmp_path / f"alone-{name}")
        alone.run(CreateTenant(name, spec))
        for op in ops(name):
            alone.run(op)
        assert_same(adapter_weights(shared, name), adapter_weights(alone, name), atol=1e-6, rtol=1e-5)
    assert {k.split(".")[-3] for k in adapter_weights(shared, "b")} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert {k.split(".")[-3] for k in adapter_weights(shared, "c")} == {"gate_proj", "up_proj", "down_proj"}


def test_a_fresh_adapter_is_the_base_model_drawn_from_its_seed(tiny_model: Path, tmp_path: Path) -> None:
    e, other = engine(tiny_model, tmp_path / "1"), engine(tiny_model, tmp_path / "2")
    for x in (e, other):
        x.run(CreateTenant("seeded", LoraSpec(rank=4, seed=5)))
        x.run(CreateTenant("derived", LoraSpec(rank=4)))
        x.run(CreateTenant("derived-2", LoraSpec(rank=4)))
    for name in ("seeded", "derived"):
        assert_same(adapter_weights(e, name), adapter_weights(other, name), atol=0.0, rtol=0.0)
    a, b = adapter_weights(e, "derived"), adapter_weights(e, "derived-2")
    assert all(not torch.equal(a[k], b[k]) for k in a if "lora_A" in k)  # the model id draws another start
    assert all(not v.any() for k, v in a.items() if "lora_B" in k)  # B = 0
    e.run(SaveForSampler("derived", tmp_path / "s"))
    config = json.loads((tmp_path / "s" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, LORA_ALPHA)


def test_a_saved_state_loaded_again_trains_on_as_if_never_saved(tiny_model: Path, tmp_path: Path) -> None:
    def steps(e: Engine, model_id: str, seeds: range) -> None:
        for s in seeds:
            e.run(ForwardBackward(model_id, tuple(datums(2, seed=s)), "importance_sampling"))
            e.run(OptimStep(model_id, AdamParams(learning_rate=1e-2)))

    straight = engine(tiny_model, tmp_path / "straight")
    straight.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    steps(straight, ID, range(4))

    e = engine(tiny_model, tmp_path / "saved")
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    steps(e, ID, range(2))
    folder = tmp_path / "saved" / "state"
    e.run(SaveState(ID, folder))
    e.run(DropTenant(ID))
    assert ID not in e.tenants
    e.run(LoadState(ID, folder, optimizer=True))
    steps(e, ID, range(2, 4))
    assert_same(adapter_weights(e, ID), adapter_weights(straight, ID), atol=1e-6, rtol=1e-5)

    # Without the optimizer state: the same weights, a fresh optimizer, so the next steps differ.
    e.run(LoadState("fresh", folder, optimizer=False))
    e.run(LoadState("moments", folder, optimizer=True))
    assert e.tenants["fresh"].lora == LoraSpec(rank=4, seed=3)
    assert_same(adapter_weights(e, "fresh"), adapter_weights(e, "moments"), atol=0.0, rtol=0.0)
    steps(e, "fresh", range(2, 3))
    steps(e, "moments", range(2, 3))
    a, b = adapter_weights(e, "fresh"), adapter_weights(e, "moments")
    assert any(not torch.allclose(a[k], b[k]) for k in a)


def test_the_sampler_folder_loads_in_peft_with_the_tenants_logits_and_the_probe(
    tiny_model: Path, tmp_path: Path
) -> None:
    e = engine(tiny_model, tmp_path)
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3, train_mlp=False)))
    trained(e, ID)
    data = datums(3, seed=9)
    served = e.run(ForwardBackward(ID, tuple(data), "cross_entropy", forward_only=True)).logprobs
    folder = tmp_path / "sampler"
    plain = plain_copy(e, ID, folder, tiny_model)
    with torch.no_grad():
        for d, lp in zip(data, served, strict=True):
            torch.testing.assert_close(direct_logprobs(plain, d), torch.tensor(lp), atol=1e-5, rtol=1e-5)
    assert (folder / STABLE).is_file()
    probe = json.loads((folder / PROBE_FILE).read_text())
    assert probe["logprobs"] != probe["base"]  # scored under the tenant's adapter, beside the base model's


@pytest.mark.parametrize(
    ("adam", "problem"),
    [
        # A fresh adapter's A gets a gradient of exactly 0 (B = 0): with eps 0, Adam's 0 / 0 is NaN.
        (AdamParams(learning_rate=1e-2, eps=0.0), "NaN or infinite"),
        # A step size beyond float32, once the first half of the weights took it.
        (AdamParams(learning_rate=1e39), "overflow"),
    ],
)
def test_an_update_that_makes_weights_non_finite_is_undone(
    tiny_model: Path, tmp_path: Path, adam: AdamParams, problem: str
) -> None:
    e, other = engine(tiny_model, tmp_path / "e"), engine(tiny_model, tmp_path / "other")
    for x in (e, other):
        x.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
        x.run(ForwardBackward(ID, tuple(datums(2, seed=1)), "cross_entropy"))
    before = adapter_weights(e, ID)
    with pytest.raises(BadRequest, match=rf"^adam_params: the update made the adapter's weights {problem}.*no weight"):
        e.run(OptimStep(ID, adam))
    assert_same(adapter_weights(e, ID), before, atol=0.0, rtol=0.0)
    assert grads(e, ID) == {}
    # The optimizer state is the one before too: the same steps on as a tenant that never tried.
    other.run(OptimStep(ID, AdamParams(learning_rate=1e-2)))
    e.run(ForwardBackward(ID, tuple(datums(2, seed=1)), "cross_entropy"))
    e.run(OptimStep(ID, AdamParams(learning_rate=1e-2)))
    for x in (e, other):
        x.run(ForwardBackward(ID, tuple(datums(2, seed=2)), "cross_entropy"))
        x.run(OptimStep(ID, AdamParams(learning_rate=1e-2)))
    assert_same(adapter_weights(e, ID), adapter_weights(other, ID), atol=0.0, rtol=0.0)


def test_a_non_finite_gradient_changes_no_weight(tiny_model: Path, tmp_path: Path) -> None:
    e = engine(tiny_model, tmp_path)
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    trained(e, ID)
    before = adapter_weights(e, ID)
    d = datums(1, seed=1)[0]
    huge = Datum(d.tokens, d.targets, advantages=d.advantages, logprobs=[-1e30] * len(d.targets))  # ratio inf
    assert not math.isfinite(e.run(ForwardBackward(ID, (huge,), "importance_sampling")).metrics["loss:sum"])
    with pytest.raises(BadRequest, match="gradient is NaN or infinite.*no weight changed"):
        e.run(OptimStep(ID, AdamParams(learning_rate=1e-2)))
    assert_same(adapter_weights(e, ID), before, atol=0.0, rtol=0.0)
    assert grads(e, ID) == {}  # discarded: the next step starts clean
    e.run(ForwardBackward(ID, (d,), "cross_entropy"))
    assert math.isfinite(e.run(OptimStep(ID, AdamParams(learning_rate=1e-2))).metrics["grad_norm"])


GOOD = Datum(tokens=[5, 6, 7], targets=[6, 7, 8], weights=[1.0, 1.0, 1.0], advantages=[1.0, 0.5, 0.0],
             logprobs=[-1.0, -2.0, -3.0])  # fmt: skip


def fb(*data: Datum, loss_fn: str = "ppo", config: dict[str, float] | None = None) -> ForwardBackward:
    return ForwardBackward(ID, (GOOD, *data), loss_fn, config or {})


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (fb(Datum([5, 6, 7], [6, 9, 8], advantages=[0, 0, 0], logprobs=[-1, -1, -1])),
         r"^data\[1\]\.targets\[1\] is 9 but tokens\[2\] is 7: lorarl-serve takes targets shifted by one"),
        (fb(Datum([5, 6], [6, 7, 8])), r"^data\[1\]\.targets: 3 targets for 2 tokens"),
        (fb(Datum([5, 259], [259, 7], advantages=[0, 0], logprobs=[-1, -1])),
         r"^data\[1\]\.tokens\[1\]: 259 is not a token of the model \(0 to 258\)"),
        (fb(Datum([5, 6], [6, -1], advantages=[0, 0], logprobs=[-1, -1])), r"^data\[1\]\.targets\[1\]: -1 is not"),
        (fb(Datum(list(range(64)), list(range(1, 65)), advantages=[0] * 64, logprobs=[-1] * 64)),
         r"^data\[1\]\.tokens: 64 tokens and the last target make 65, more than seq_len 64"),
        (fb(Datum([5, 6], [6, 7], advantages=[0, math.nan], logprobs=[-1, -1])),
         r"^data\[1\]\.advantages\[1\]: nan is not a finite number"),
        (fb(Datum([5, 6], [6, 7], advantages=[0, 0])), r"^data\[1\]\.logprobs: missing"),
        (fb(Datum([5, 6], [6, 7], advantages=[0])), r"^data\[1\]\.advantages: 1 values for 2 targets"),
        (fb(Datum([5, 6], [6, 7]), loss_fn="cross_entropy"), r"^data\[1\]\.weights: missing"),
        (fb(Datum([], [])), r"^data\[1\]\.tokens: empty"),
        (fb(loss_fn="dro"),
         r"^loss_fn 'dro' is not served here: one of cispo, cross_entropy, importance_sampling, mask, ppo"),
        (fb(loss_fn="ppo", config={"clip_ratio": 0.2}),
         r"^loss_fn_config\.clip_ratio: not a key of loss_fn 'ppo' "
         r"\(its keys: clip_low_threshold, clip_high_threshold\)"),
        (fb(loss_fn="importance_sampling", config={"clip_low_threshold": 0.8}),
         r"^loss_fn_config\.clip_low_threshold: not a key of loss_fn 'importance_sampling' \(it takes none\)"),
        (fb(loss_fn="ppo", config={"clip_low_threshold": 1.5}), r"^loss_fn_config\.clip_low_threshold: 1\.5"),
        (fb(loss_fn="mask", config={"ratio_low": -1.0}), r"^loss_fn_config\.ratio_low: "),
        (ForwardBackward(ID, (), "ppo"), r"^data: no datum"),
        (ForwardBackward("nobody", (GOOD,), "ppo"), r"^model_id 'nobody': no such model"),
        (OptimStep(ID, AdamParams(learning_rate=math.inf)), r"^adam_params\.learning_rate: inf is out of range"),
        (OptimStep(ID, AdamParams(beta2=1.0)), r"^adam_params\.beta2: 1\.0 is out of range"),
        (CreateTenant("another", LoraSpec(rank=33)), r"^rank 33: this server serves ranks 1 to 32 \(serve\.max_rank\)"),
        (CreateTenant("another", LoraSpec(rank=4, train_attn=False, train_mlp=False)),
         r"^train_attn and train_mlp are both false"),
        (CreateTenant(ID, LoraSpec(rank=4)), r"already created"),
        (DropTenant("nobody"), r"^model_id 'nobody'"),
    ],
)  # fmt: skip
def test_a_bad_request_names_its_field_and_changes_nothing(
    tiny_model: Path, tmp_path: Path, op: Any, message: str
) -> None:
    e = engine(tiny_model, tmp_path)
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    trained(e, ID)
    e.run(ForwardBackward(ID, (GOOD,), "ppo"))  # a gradient waiting for its step
    before, gradient = adapter_weights(e, ID), grads(e, ID)
    with pytest.raises(BadRequest, match=message) as caught:
        e.run(op)
    assert "\n" not in str(caught.value)
    assert_same(adapter_weights(e, ID), before, atol=0.0, rtol=0.0)
    assert_same(grads(e, ID), gradient, atol=0.0, rtol=0.0)
    assert set(e.tenants) == {ID}


def test_one_tenant_more_than_max_tenants_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    e = engine(tiny_model, tmp_path, serve={"max_tenants": 2})
    e.run(CreateTenant("a", LoraSpec(rank=2)))
    e.run(CreateTenant("b", LoraSpec(rank=2)))
    with pytest.raises(BadRequest, match=r"holds 2 training clients, serve\.max_tenants"):
        e.run(CreateTenant("c", LoraSpec(rank=2)))
    e.run(DropTenant("a"))
    e.run(CreateTenant("c", LoraSpec(rank=2)))  # a place freed
    e.run(DropTenant("b"))
    e.run(DropTenant("c"))
    e.run(CreateTenant("d", LoraSpec(rank=2)))  # the PEFT model outlives its last adapter
    assert set(e.tenants) == {"d"}


def test_load_state_refuses_what_is_not_a_saved_state(tiny_model: Path, tmp_path: Path) -> None:
    e = engine(tiny_model, tmp_path)
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    e.run(SaveForSampler(ID, tmp_path / "sampler"))
    with pytest.raises(BadRequest, match=r"^path: sampler is not a saved training state"):
        e.run(LoadState("new", tmp_path / "sampler", optimizer=True))
    e.run(SaveState(ID, tmp_path / "state"))
    (tmp_path / "state" / "optimizer.pt").write_bytes(b"damaged")
    with pytest.raises(BadRequest, match=r"^path: state is damaged: .*optimizer\.pt has 7 bytes"):
        e.run(LoadState("new", tmp_path / "state", optimizer=True))
    e.run(CreateTenant("rank8", LoraSpec(rank=8)))
    e.run(SaveState(ID, tmp_path / "state"))
    with pytest.raises(BadRequest, match=r"holds a rank-4 attn\+mlp adapter, model 'rank8' is a rank-8 attn\+mlp one"):
        e.run(LoadState("rank8", tmp_path / "state", optimizer=True))
    assert set(e.tenants) == {ID, "rank8"}  # no tenant left behind by a failed load


def test_a_save_never_replaces_a_file_lorarl_did_not_write(tiny_model: Path, tmp_path: Path) -> None:
    e = engine(tiny_model, tmp_path)
    e.run(CreateTenant(ID, LoraSpec(rank=4, seed=3)))
    mine = tmp_path / "users"
    mine.mkdir()
    (mine / "adapter_config.json").write_text("{}")
    with pytest.raises(BadRequest, match=r"^path: .*adapter_config\.json"):
        e.run(SaveState(ID, mine))
    assert (mine / "adapter_config.json").read_text() == "{}"
