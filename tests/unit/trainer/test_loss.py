import math

import pytest
import torch
from pydantic import TypeAdapter

import lorarl
from lorarl.config.algorithms import CustomLoss, LossBase, LossConfig
from lorarl.config.loader import ConfigError, load_config
from lorarl.config.run import RLConfig
from lorarl.plugins import ArgsError, PluginError
from lorarl.trainer.batching import TrainSample, micro_batches
from lorarl.trainer.loss import (
    LossNorm,
    micro_batch_loss,
    policy_loss,
    token_logprobs,
    token_logprobs_and_entropy,
)
from lorarl.trainer.losses import LossInputs, policy_term
from lorarl.trainer.packing import collate_packed

# Three samples of three completion tokens and one with no loss token (all-False mask). Token ratios
# exp(new - old): e^0.5, e^-0.1, 1 | e^-0.7, 1, (e^1, no loss) | e^0.1, e^0.05, e^-0.05 | (none).
# Sequence ratios (geometric mean over loss tokens): e^(0.4/3) = 1.14 in range, e^-0.35 = 0.70 out of
# [0.8, 1.28], e^(0.1/3) = 1.03 in range.
OLD = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -3.0], [-0.9, -0.4, -1.1], [-0.2, -0.2, -0.2]]
NEW = [[-0.5, -2.1, -0.5], [-1.0, -1.2, -2.0], [-0.8, -0.35, -1.15], [-0.6, -0.1, -0.9]]
REF = [[-0.7, -1.9, -0.6], [-0.9, -1.0, -2.5], [-0.8, -0.5, -1.0], [-0.3, -0.3, -0.3]]
MASK = [[True, True, True], [True, True, False], [True, True, True], [False, False, False]]
ADV = [1.5, -0.7, 0.4, 2.0]
LOW, HIGH = 0.2, 0.28
# Mismatch weights exp(NEW - OLD), token by token: only e^0.5 = 1.65 (of 8 loss tokens) is above CAP;
# per sample (products): e^0.4 = 1.49 (3 loss tokens) is, e^-0.7 = 0.50 and e^0.1 = 1.11 are not.
CAP = 1.3
# IcePop's lower bound: e^-0.7 = 0.50 is below it, per token (1 loss token) and per sample (2).
LOW_W = 0.6
# Geometric-mean sample weights e^(0.4/3) = 1.14, e^-0.35 = 0.70, e^(0.1/3) = 1.03: only the second
# sample (2 loss tokens) is outside [1/GEO, GEO].
GEO = 1.2
# The policy's entropy at each target.
ENT = [[0.9, 1.4, 0.2], [2.0, 0.7, 1.1], [0.5, 1.6, 0.8], [1.0, 1.0, 1.0]]
# The built-in token-level clip loss as a custom loss (token_clip_loss below), its trust region from args.
CUSTOM_CLIP = "tests.unit.trainer.test_loss:token_clip_loss"
CUSTOM = {"type": "custom", "fn": CUSTOM_CLIP, "args": {"ratio_low": LOW, "ratio_high": HIGH}}
LOSS: TypeAdapter[LossBase] = TypeAdapter(LossConfig)


def loss_section(**keys) -> LossBase:
    """A [trainer.loss] section; "ppo" unless `keys` give a type."""
    return LOSS.validate_python({"type": "ppo", **keys})


def samples_with(old: list[list[float]], mask: list[list[bool]], advantages: list[float]) -> list[TrainSample]:
    return [
        TrainSample(input_ids=[1] * (len(o) + 1), loss_mask=[False, *m], old_logprobs=[0.0, *o], advantage=a)
        for o, m, a in zip(old, mask, advantages, strict=True)
    ]


def batch_with(old: list[list[float]], mask: list[list[bool]], advantages: list[float]):
    samples = samples_with(old, mask, advantages)
    return next(micro_batches(samples, size=len(samples), pad_id=0))


def on_loss_tokens(*tables: list[list[float]]) -> list[tuple[float, ...]]:
    """(table_1[i][t], table_2[i][t], ...) for every loss token (i, t) of MASK."""
    return [v[:-1] for rows in zip(*tables, MASK, strict=True) for v in zip(*rows, strict=True) if v[-1]]


def reference_loss(new, old, mask, adv, cfg: LossBase, *, frozen=None, ref=None, ent=None) -> float:
    """The module docstrings of loss.py and mismatch.py, one token at a time, for the options of `cfg`.
    What the loss takes without gradient (CISPO's weight, pi_old and the mismatch weight) comes from
    `frozen`: the unperturbed logprobs while central differences perturb `new`."""
    frozen = new if frozen is None else frozen
    anchor = old if cfg.mismatch_correction == "none" else frozen  # pi_vLLM, or pi_old
    n_tokens = sum(sum(m) for m in mask)
    n_samples = sum(any(m) for m in mask)

    def ratio(logprobs, i, t, loss_tokens):
        if getattr(cfg, "ratio_level", "token") == "sequence":
            return math.exp(sum(logprobs[i][u] - anchor[i][u] for u in loss_tokens) / len(loss_tokens))
        return math.exp(logprobs[i][t] - anchor[i][t])

    total = 0.0
    for i in range(len(new)):
        loss_tokens = [t for t, m in enumerate(mask[i]) if m]
        if not loss_tokens:
            continue
        row = 0.0
        for t in loss_tokens:
            r, a = ratio(new, i, t, loss_tokens), adv[i]
            if cfg.type in ("ppo", "custom"):  # the custom loss is the token-level clip
                g = -min(r * a, min(max(r, 1 - LOW), 1 + HIGH) * a)
            elif cfg.type == "importance_sampling":
                g = -r * a
            elif cfg.type == "cross_entropy":
                g = -a * new[i][t]
            elif cfg.type == "mask":
                g = -r * a if 1 - LOW <= r <= 1 + HIGH else 0.0
            else:  # cispo
                g = -min(max(ratio(frozen, i, t, loss_tokens), 1 - LOW), 1 + HIGH) * a * new[i][t]
            if cfg.mismatch_level == "sequence":
                w = math.exp(sum(frozen[i][u] - old[i][u] for u in loss_tokens))
            else:
                w = math.exp(frozen[i][t] - old[i][t])
            low = cfg.mismatch_low if cfg.mismatch_correction == "icepop" else 0.0
            kept = w if low <= w <= cfg.mismatch_cap else 0.0
            c = {"none": 1.0, "tis": min(w, cfg.mismatch_cap), "mis": kept, "icepop": kept}[cfg.mismatch_correction]
            geo = math.exp(sum(frozen[i][u] - old[i][u] for u in loss_tokens) / len(loss_tokens))
            if cfg.mismatch_geo_mask is not None and not 1 / cfg.mismatch_geo_mask <= geo <= cfg.mismatch_geo_mask:
                c = 0.0
            row += c * g
            if ref is not None:
                d = ref[i][t] - new[i][t]
                row += cfg.kl_coef * (math.exp(d) - d - 1)
            if ent is not None:
                row -= cfg.entropy_coef * ent[i][t]
        if cfg.norm == "token":
            total += row / n_tokens
        elif cfg.norm == "sequence":
            total += row / (len(loss_tokens) * n_samples)
        else:
            assert cfg.norm_constant is not None
            total += row / cfg.norm_constant
    return total


def central_differences(f, table: list[list[float]], h: float = 1e-6) -> list[list[float]]:
    """d f / d table[i][t] for every entry of `table`."""
    grads = []
    for i in range(len(table)):
        grads.append([])
        for t in range(len(table[i])):
            up = [row[:] for row in table]
            down = [row[:] for row in table]
            up[i][t] += h
            down[i][t] -= h
            grads[i].append((f(up) - f(down)) / (2 * h))
    return grads


@lorarl.plugin("loss")
def token_clip_loss(
    inputs: LossInputs, *, ratio_low: float, ratio_high: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The built-in token-level "ppo" loss, written as a custom loss with its trust region from args."""
    ratio = torch.exp((inputs.logprobs - inputs.sampler_logprobs) * inputs.loss_mask)
    low, high = 1 - ratio_low, 1 + ratio_high
    loss = -torch.minimum(ratio * inputs.advantages, ratio.clamp(low, high) * inputs.advantages)
    clipped = ((ratio < low) | (ratio > high)) & inputs.loss_mask
    return loss, {"clipped_frac": clipped.sum() / inputs.loss_mask.sum().clamp(min=1)}


@lorarl.plugin("loss")
def scalar_loss(inputs: LossInputs) -> torch.Tensor:
    return inputs.logprobs.sum()


@lorarl.plugin("loss")
def per_token_metric(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return -inputs.logprobs, {"logprobs": inputs.logprobs.detach()}


# The 24 variants of ratio level, mode, norm and KL penalty; CISPO in each; then the mismatch
# corrections, under which the trust region's ratio is pi_trainer / pi_old whatever its level and mode;
# the entropy bonus; the unclipped types (importance sampling, cross entropy); and a custom loss that is the
# built-in token-level clip loss, its trust region given as args.
VARIANTS = [
    {"ratio_level": level, "type": mode, "norm": norm, "kl_coef": kl}
    for level in ("token", "sequence")
    for mode in ("ppo", "mask", "cispo")
    for norm in ("token", "sequence", "constant")
    for kl in (0.0, 0.3)
]
VARIANTS += [
    {"mismatch_correction": correction, "mismatch_level": level, "mismatch_cap": CAP, "norm": norm, "kl_coef": 0.3}
    for correction in ("tis", "mis")
    for level in ("token", "sequence")
    for norm in ("token", "sequence", "constant")
]
VARIANTS += [
    *({"mismatch_correction": "icepop", "mismatch_level": level, "mismatch_cap": CAP, "mismatch_low": LOW_W,
       "kl_coef": 0.3} for level in ("token", "sequence")),
    *({"mismatch_correction": c, "mismatch_geo_mask": GEO, **({"mismatch_cap": CAP} if c != "none" else {}),
       **({"mismatch_low": LOW_W} if c == "icepop" else {}), "norm": "sequence"} for c in ("none", "tis", "icepop")),
    {"mismatch_geo_mask": GEO, "ratio_level": "sequence", "type": "cispo"},
    {"mismatch_correction": "tis", "mismatch_cap": CAP, "ratio_level": "sequence", "type": "mask"},
    {"mismatch_correction": "mis", "mismatch_level": "sequence", "mismatch_cap": CAP, "type": "cispo"},
    *({"entropy_coef": 0.05, "norm": norm} for norm in ("token", "sequence", "constant")),
    {"entropy_coef": 0.05, "type": "cispo", "ratio_level": "sequence", "kl_coef": 0.3, "norm": "sequence",
     "mismatch_correction": "tis", "mismatch_level": "sequence", "mismatch_cap": CAP},
    *({"type": t, "norm": norm, "kl_coef": 0.3} for t in ("importance_sampling", "cross_entropy")
      for norm in ("token", "sequence", "constant")),
    {"type": "importance_sampling", "mismatch_correction": "tis", "mismatch_cap": CAP, "entropy_coef": 0.05},
    {"type": "cross_entropy", "mismatch_geo_mask": GEO, "mismatch_correction": "icepop", "mismatch_cap": CAP,
     "mismatch_low": LOW_W},
    *({**CUSTOM, "norm": norm, "kl_coef": 0.3} for norm in ("token", "sequence", "constant")),
    {**CUSTOM, "entropy_coef": 0.05},
]  # fmt: skip


def loss_config(variant: dict) -> LossBase:
    constant = {"norm_constant": 40.0} if variant.get("norm") == "constant" else {}
    trust_region = variant.get("type", "ppo") in ("ppo", "mask", "cispo")
    region = {"ratio_low": LOW, "ratio_high": HIGH} if trust_region else {}
    return loss_section(**region | constant | variant)


def variant_id(variant: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in variant.items() if k != "args")


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_policy_loss_and_its_gradient_match_a_direct_computation(variant: dict) -> None:
    cfg = loss_config(variant)
    ref = REF if cfg.kl_coef else None
    ent = ENT if cfg.entropy_coef else None

    def expected(new: list[list[float]], ent: list[list[float]] | None = ent) -> float:
        return reference_loss(new, OLD, MASK, ADV, cfg, frozen=NEW, ref=ref, ent=ent)

    samples = samples_with(OLD, MASK, ADV)
    batch = next(micro_batches(samples, size=len(samples), pad_id=0))
    new = torch.tensor(NEW, dtype=torch.float64, requires_grad=True)
    ref_t = torch.tensor(REF, dtype=torch.float64) if ref else None
    ent_t = torch.tensor(ENT, dtype=torch.float64, requires_grad=True) if ent else None
    loss, stats = policy_loss(new, batch, cfg, LossNorm.for_step(cfg, samples), ref_t, ent_t)
    assert math.isclose(loss.item(), expected(NEW), rel_tol=1e-6)

    # The gradient w.r.t. every logprob (and entropy) against central differences of the direct computation.
    loss.backward()
    assert new.grad is not None
    for i, row in enumerate(central_differences(expected, NEW)):
        for t, numeric in enumerate(row):
            assert math.isclose(new.grad[i, t].item(), numeric, rel_tol=1e-5, abs_tol=1e-8), (i, t)
    if ent_t is not None:
        assert ent_t.grad is not None
        numeric_ent = central_differences(lambda e: expected(NEW, e), ENT)
        torch.testing.assert_close(ent_t.grad, torch.tensor(numeric_ent, dtype=torch.float64), rtol=1e-5, atol=1e-8)

    assert ("kl_to_base" in stats) == bool(cfg.kl_coef)
    if cfg.kl_coef:
        k3 = [math.exp(r - n) - (r - n) - 1 for r, n in on_loss_tokens(REF, NEW)]
        assert math.isclose(stats["kl_to_base"].item(), sum(k3) / len(k3), rel_tol=1e-6)
    assert ("ratio/mean" in stats) == (cfg.type not in ("custom", "cross_entropy"))
    if cfg.mismatch_correction != "none":
        # The trust region's ratio pi_trainer / pi_old is 1; the mismatch weights as in the comment at CAP.
        assert stats.get("ratio/mean", 1.0) == 1.0 and stats.get("ratio/out_of_range_frac", 0.0) == 0.0
        # Flagged loss tokens (token level, sequence level), as in the comments at CAP and LOW_W.
        flagged = {"tis": (1, 3), "mis": (1, 3), "icepop": (2, 5)}[cfg.mismatch_correction]
        key = "mismatch/capped_frac" if cfg.mismatch_correction == "tis" else "mismatch/masked_frac"
        expected_frac = flagged[cfg.mismatch_level == "sequence"] / 8
        assert math.isclose(stats[key].item(), expected_frac, rel_tol=1e-6)
    if cfg.mismatch_correction != "none" or cfg.mismatch_geo_mask is not None:
        if cfg.mismatch_level == "token":
            w = [math.exp(n - o) for n, o in on_loss_tokens(NEW, OLD)]
        else:
            w = [math.exp(0.4)] * 3 + [math.exp(-0.7)] * 2 + [math.exp(0.1)] * 3
        bounds = {"none": (0.0, math.inf), "tis": (0.0, math.inf), "mis": (0.0, CAP), "icepop": (LOW_W, CAP)}
        low, high = bounds[cfg.mismatch_correction]
        applied = [min(x, CAP) if cfg.mismatch_correction == "tis" else x if low <= x <= high else 0.0 for x in w]
        if cfg.mismatch_correction == "none":
            applied = [1.0] * 8
        if cfg.mismatch_geo_mask is not None:
            applied[3:5] = [0.0, 0.0]  # the second sample's, as in the comment at GEO
            assert math.isclose(stats["mismatch/geo_masked_frac"].item(), 2 / 8, rel_tol=1e-6)
        assert math.isclose(stats["mismatch/weight_mean"].item(), sum(applied) / 8, rel_tol=1e-6)
    else:
        assert not any(k.startswith(("mismatch/capped", "mismatch/masked", "mismatch/weight")) for k in stats)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_packed_rows_give_the_padded_loss_gradient_and_stats(variant: dict) -> None:
    """The per-sample sums (sequence ratio, sequence norm, sequence mismatch weight) group a packed
    row's tokens by sample."""
    cfg = loss_config(variant)
    samples = samples_with(OLD, MASK, ADV)
    norm_ = LossNorm.for_step(cfg, samples)
    padded = next(micro_batches(samples, size=len(samples), pad_id=0))
    # Rows of 12 and 4 tokens: the second is padded, and the sample without loss tokens shares a row.
    rows = [[0, 1, 3], [2]]
    packed = collate_packed([[samples[i] for i in row] for row in rows], pad_id=0, temperature=1.0)
    assert packed.sample_index.tolist() == [[0] * 3 + [1] * 4 + [2] * 4, [3] * 3 + [3] * 8]

    def packed_like(table: list[list[float]]) -> torch.Tensor:
        # Sample i's target t sits at its row's offset + t. Where no sample's target is (a sample's
        # first token, the padding) a value that would show if it leaked into the loss.
        out = torch.full(packed.loss_mask.shape, 5.0, dtype=torch.float64)
        for r, row in enumerate(rows):
            for k, i in enumerate(row):
                out[r, 4 * k : 4 * k + 3] = torch.tensor(table[i], dtype=torch.float64)
        return out

    new = torch.tensor(NEW, dtype=torch.float64, requires_grad=True)
    new_packed = packed_like(NEW).requires_grad_()
    ref, ref_packed = (torch.tensor(REF, dtype=torch.float64), packed_like(REF)) if cfg.kl_coef else (None, None)
    ent, ent_packed = None, None
    if cfg.entropy_coef:
        ent, ent_packed = torch.tensor(ENT, dtype=torch.float64, requires_grad=True), packed_like(ENT).requires_grad_()
    loss, stats = policy_loss(new, padded, cfg, norm_, ref, ent)
    packed_loss, packed_stats = policy_loss(new_packed, packed, cfg, norm_, ref_packed, ent_packed)
    assert math.isclose(packed_loss.item(), loss.item(), rel_tol=1e-12)
    assert stats.keys() == packed_stats.keys()
    for k, v in stats.items():
        assert math.isclose(packed_stats[k].item(), v.item(), rel_tol=1e-12), k
    loss.backward()
    packed_loss.backward()
    assert new.grad is not None and new_packed.grad is not None
    torch.testing.assert_close(new_packed.grad, packed_like(new.grad.tolist()).where(packed.loss_mask, 0.0))
    if ent is not None and ent_packed is not None:
        assert ent.grad is not None and ent_packed.grad is not None
        torch.testing.assert_close(ent_packed.grad, packed_like(ent.grad.tolist()).where(packed.loss_mask, 0.0))


@pytest.mark.parametrize("mode", ["ppo", "mask", "cispo"])
def test_ratio_stats_are_of_the_ratio_the_loss_uses(mode: str) -> None:
    """out_of_range_frac: the fraction of loss tokens clipped ("clip", "cispo") or masked."""
    batch = batch_with(OLD, MASK, ADV)
    new = torch.tensor(NEW)
    norm = LossNorm("token", 8)
    _, per_token = policy_loss(new, batch, loss_section(ratio_level="token", type=mode), norm)
    _, per_sample = policy_loss(new, batch, loss_section(ratio_level="sequence", type=mode), norm)
    # 8 loss tokens. Per token, e^0.5 = 1.65 and e^-0.7 = 0.50 are out of [0.8, 1.28]; per sample, the
    # second (2 loss tokens) is.
    assert math.isclose(per_token["ratio/out_of_range_frac"].item(), 2 / 8, rel_tol=1e-6)
    assert math.isclose(per_sample["ratio/out_of_range_frac"].item(), 2 / 8, rel_tol=1e-6)
    token_ratios = [math.exp(n - o) for n, o in on_loss_tokens(NEW, OLD)]
    assert math.isclose(per_token["ratio/mean"].item(), sum(token_ratios) / 8, rel_tol=1e-6)
    sample_ratios = [math.exp(0.4 / 3)] * 3 + [math.exp(-0.35)] * 2 + [math.exp(0.1 / 3)] * 3
    assert math.isclose(per_sample["ratio/mean"].item(), sum(sample_ratios) / 8, rel_tol=1e-6)
    # The sampler mismatch is per token whatever ratio the loss uses.
    diffs = [abs(n - o) for n, o in on_loss_tokens(NEW, OLD)]
    k3 = [math.exp(n - o) - 1 - (n - o) for n, o in on_loss_tokens(NEW, OLD)]
    for stats in (per_token, per_sample):
        assert math.isclose(stats["mismatch/logprob_abs_diff"].item(), sum(diffs) / 8, rel_tol=1e-5)
        assert math.isclose(stats["mismatch/kl"].item(), sum(k3) / 8, rel_tol=1e-5)


@pytest.mark.parametrize(
    "extra",
    [{}, {"type": "cispo"}, {"mismatch_correction": "mis", "mismatch_level": "sequence", "mismatch_cap": CAP},
     {"entropy_coef": 0.1}, CUSTOM],
    ids=variant_id,
)  # fmt: skip
@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batch_losses_add_up_to_the_step_loss(norm: str, level: str, extra: dict) -> None:
    """Gradient accumulation: the step's normalizer is fixed before the micro-batches run."""
    level_key = {} if extra.get("type") == "custom" else {"ratio_level": level}
    cfg = loss_section(**level_key, norm=norm, norm_constant=40.0 if norm == "constant" else None, kl_coef=0.1, **extra)
    samples = samples_with(OLD, MASK, ADV)
    step_norm = LossNorm.for_step(cfg, samples)
    new, ref, ent = torch.tensor(NEW), torch.tensor(REF), torch.tensor(ENT)
    whole, _ = policy_loss(new, next(micro_batches(samples, size=4, pad_id=0)), cfg, step_norm, ref, ent)
    parts = [
        policy_loss(new[i : i + 2], mb, cfg, step_norm, ref[i : i + 2], ent[i : i + 2])[0]
        for i, mb in zip((0, 2), micro_batches(samples, size=2, pad_id=0), strict=True)
    ]
    assert math.isclose(sum(p.item() for p in parts), whole.item(), rel_tol=1e-6)


def test_loss_norm_denominators() -> None:
    samples = samples_with(OLD, MASK, ADV)
    assert LossNorm.for_step(loss_section(norm="token"), samples) == LossNorm("token", 8)
    # The sample without loss tokens does not count.
    assert LossNorm.for_step(loss_section(norm="sequence"), samples) == LossNorm("sequence", 3)
    assert LossNorm.for_step(loss_section(norm="constant", norm_constant=512), samples) == LossNorm("constant", 512)
    with pytest.raises(ValueError, match="norm_constant"):
        loss_section(norm="constant")


def test_on_policy_gradient_is_the_reinforce_gradient() -> None:
    """With ratio 1 the loss gradient w.r.t. logprobs is -A / n_tokens on every loss token."""
    old = [[-1.0, -2.0], [-0.5, -0.1]]
    samples = samples_with(old, [[True, True], [True, False]], [2.0, -1.0])
    batch = next(micro_batches(samples, size=2, pad_id=0))
    new = torch.tensor(old, requires_grad=True)
    loss, _ = policy_loss(new, batch, loss_section(), LossNorm.for_step(loss_section(), samples))
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))


class BigramModel(torch.nn.Module):
    """Logits that are a table's row for the previous token: the table is the hidden state, read by an
    output head that passes it on, as a transformers model's head reads its last hidden states."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(10, 10))
        self.head = torch.nn.Identity()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids, attention_mask, use_cache):
        return type("Out", (), {"logits": self.head(self.table[input_ids])})


def test_token_logprobs_apply_the_temperature_and_align_with_targets() -> None:
    model = BigramModel()
    sample = TrainSample(input_ids=[3, 5, 7], loss_mask=[False, True, True], temperature=0.5)
    mb = next(micro_batches([sample], size=1, pad_id=0))
    lp = token_logprobs(model, mb)
    expected = [torch.log_softmax(model.table[a] / 0.5, -1)[b].item() for a, b in ((3, 5), (5, 7))]
    assert torch.allclose(lp[0], torch.tensor(expected))


def test_entropy_is_of_the_tempered_next_token_distribution() -> None:
    model = BigramModel()
    sample = TrainSample(input_ids=[3, 5, 7], loss_mask=[False, True, True], temperature=0.7)
    mb = next(micro_batches([sample], size=1, pad_id=0))
    lp, entropy = token_logprobs_and_entropy(model, mb)
    assert torch.equal(lp, token_logprobs(model, mb))
    for t, prev in enumerate((3, 5)):
        logits = [x / 0.7 for x in model.table[prev].tolist()]
        z = sum(math.exp(x) for x in logits)
        expected = -sum(math.exp(x) / z * (x - math.log(z)) for x in logits)
        assert math.isclose(entropy[0, t].item(), expected, rel_tol=1e-5)
    assert not entropy.requires_grad


def test_entropy_with_gradient_has_the_gradient_of_the_entropy() -> None:
    """dH/dz_j = -p_j (log p_j + H) / T for the logits z of a distribution p = softmax(z / T)."""
    model = BigramModel()
    sample = TrainSample(input_ids=[3, 5, 7], loss_mask=[False, True, True], temperature=0.7)
    mb = next(micro_batches([sample], size=1, pad_id=0))
    _, entropy = token_logprobs_and_entropy(model, mb, with_grad=True)
    entropy.sum().backward()
    assert model.table.grad is not None
    for prev in (3, 5):
        p = torch.softmax(model.table[prev].detach() / 0.7, -1)
        h = -(p * p.log()).sum()
        torch.testing.assert_close(model.table.grad[prev], -p * (p.log() + h) / 0.7)
    assert model.table.grad[[0, 1, 2, 4, 6, 7, 8, 9]].abs().sum() == 0


def bigram_batch(model: BigramModel):
    """Two samples of the bigram model's tokens, sampler logprobs its own plus noise (some clipped)."""
    rng = torch.Generator().manual_seed(3)
    samples = [
        TrainSample(input_ids=ids, loss_mask=[False, *([True] * (len(ids) - 1))], old_logprobs=[0.0] * len(ids),
                    advantage=adv, temperature=0.9)
        for ids, adv in (([1, 4, 2, 8, 5, 7], 1.0), ([3, 3, 9, 0], -0.6))
    ]  # fmt: skip
    with torch.no_grad():
        for s in samples:
            policy = token_logprobs(model, next(micro_batches([s], size=1, pad_id=0)))[0]
            s.old_logprobs = [0.0, *(policy + 0.3 * torch.randn(len(policy), generator=rng)).tolist()]
    return samples, next(micro_batches(samples, size=2, pad_id=0))


def loss_and_table_grad(model: BigramModel, batch, cfg: LossBase, norm: LossNorm):
    model.zero_grad()
    loss, stats = micro_batch_loss(model, batch, cfg, norm)  # type: ignore[arg-type]  # no adapter needed
    loss.backward()
    assert model.table.grad is not None
    return loss, stats, model.table.grad.clone()


def test_the_entropy_bonus_subtracts_entropy_coef_times_the_mean_entropy() -> None:
    model = BigramModel()
    samples, batch = bigram_batch(model)
    norm = LossNorm.for_step(loss_section(), samples)  # token: the batch's 8 loss tokens
    loss, stats, grad = loss_and_table_grad(model, batch, loss_section(), norm)
    bonus_loss, bonus_stats, bonus_grad = loss_and_table_grad(model, batch, loss_section(entropy_coef=0.1), norm)
    assert bonus_stats["entropy"].item() == stats["entropy"].item() > 0
    assert math.isclose(bonus_loss.item(), loss.item() - 0.1 * stats["entropy"].item(), rel_tol=1e-6)
    # The difference of the gradients is that of -0.1 * the mean entropy over the loss tokens.
    model.zero_grad()
    _, entropy = token_logprobs_and_entropy(model, batch, with_grad=True)
    (-0.1 * (entropy * batch.loss_mask).sum() / 8).backward()
    assert model.table.grad is not None and model.table.grad.abs().sum() > 0
    torch.testing.assert_close(bonus_grad - grad, model.table.grad, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="needs the entropy"):
        policy_loss(torch.tensor(NEW), batch_with(OLD, MASK, ADV), loss_section(entropy_coef=0.1), norm)


@pytest.mark.parametrize("norm", ["token", "sequence", "constant"])
def test_a_custom_loss_that_is_the_clip_loss_gives_the_built_in_loss_and_gradients(norm: str) -> None:
    model = BigramModel()
    samples, batch = bigram_batch(model)
    builtin = loss_section(norm=norm, norm_constant=40.0 if norm == "constant" else None, kl_coef=0.0)
    custom = loss_section(**CUSTOM, norm=norm, norm_constant=40.0 if norm == "constant" else None, kl_coef=0.0)
    step_norm = LossNorm.for_step(builtin, samples)
    loss, stats, grad = loss_and_table_grad(model, batch, builtin, step_norm)
    custom_loss, custom_stats, custom_grad = loss_and_table_grad(model, batch, custom, step_norm)
    assert 0 < stats["ratio/out_of_range_frac"].item() < 1
    assert custom_loss.item() == loss.item()
    assert torch.equal(custom_grad, grad) and grad.abs().sum() > 0
    assert custom_stats["loss_fn/clipped_frac"].item() == stats["ratio/out_of_range_frac"].item()
    # The built-in stats that are not of the built-in ratio are there still.
    diagnostics = {"mismatch/logprob_abs_diff", "mismatch/kl", "mismatch/is_weight_mean", "mismatch/is_weight_sq_mean"}
    assert custom_stats.keys() == {*diagnostics, "loss_fn/clipped_frac", "entropy"}
    for key in (*diagnostics, "entropy"):
        assert custom_stats[key].item() == stats[key].item()


def custom(fn: str, **args: object) -> CustomLoss:
    return CustomLoss(fn=f"tests.unit.trainer.test_loss:{fn}" if ":" not in fn else fn, args=args)


def test_a_custom_loss_is_checked_where_it_is_loaded_and_where_it_returns() -> None:
    assert policy_term(custom("token_clip_loss", ratio_low=LOW, ratio_high=HIGH)) == (
        token_clip_loss,
        {"ratio_low": LOW, "ratio_high": HIGH},
    )
    with pytest.raises(PluginError, match="trainer.loss.fn 'tests.unit.no_such_module:f': No module named"):
        policy_term(custom("tests.unit.no_such_module:f"))
    with pytest.raises(PluginError, match="has no attribute 'no_such_loss'"):
        policy_term(custom("no_such_loss"))
    with pytest.raises(PluginError, match="trainer.loss.fn '.*:CAP' is a float, not a function"):
        policy_term(custom("CAP"))
    with pytest.raises(ArgsError, match="args do not fit token_clip_loss: missing a required argument: 'ratio_high'"):
        policy_term(custom("token_clip_loss", ratio_low=LOW))
    with pytest.raises(ArgsError, match="args.ratio_low = 'wide': token_clip_loss takes ratio_low: float"):
        policy_term(custom("token_clip_loss", ratio_low="wide", ratio_high=HIGH))
    batch, norm = batch_with(OLD, MASK, ADV), LossNorm("token", 8)
    with pytest.raises(TypeError, match=r"returned \(\), not a per-token loss of shape \(4, 3\)"):
        policy_loss(torch.tensor(NEW), batch, custom("scalar_loss"), norm)
    with pytest.raises(TypeError, match=r"metrics \['logprobs'\] are not scalar tensors"):
        policy_loss(torch.tensor(NEW), batch, custom("per_token_metric"), norm)


@pytest.mark.parametrize("value", ["mypkg.losses", "mypkg.losses:", ":my_loss", "my pkg:loss", "mypkg:losses.my_loss"])
def test_a_custom_loss_is_checked_for_the_module_function_form_at_config_load(value: str) -> None:
    with pytest.raises(ConfigError, match="trainer.loss.fn: .*not of the form 'package.module:function'"):
        load_config(RLConfig, ["--model.name", "m", "--trainer.loss.type", "custom", "--trainer.loss.fn", value])
    # Only the form: the module is imported by the trainer, so a config may name one not importable here.
    flags = ["--trainer.loss.type", "custom", "--trainer.loss.fn", "mypkg.losses:my_loss"]
    cfg = load_config(RLConfig, ["--model.name", "m", *flags, "--trainer.loss.args", '{"beta": 0.1}'])
    assert isinstance(cfg.trainer.loss, CustomLoss)
    assert (cfg.trainer.loss.fn, cfg.trainer.loss.args) == ("mypkg.losses:my_loss", {"beta": 0.1})


def test_a_custom_loss_does_not_take_a_mismatch_correction() -> None:
    with pytest.raises(ValueError, match="would correct twice"):
        loss_section(**CUSTOM, mismatch_correction="tis")
    with pytest.raises(ValueError, match="leave mismatch_geo_mask out"):
        loss_section(**CUSTOM, mismatch_geo_mask=1.01)


@pytest.mark.parametrize("correction", ["tis", "mis"])
def test_a_sequence_mismatch_weight_beyond_float_range_is_capped_or_masked_not_infinite(correction: str) -> None:
    """The product of 200 token weights e^1 is e^200, beyond float32; e^-200 underflows to 0."""
    old = [[-3.0] * 200, [-1.0] * 200]
    samples = samples_with(old, [[True] * 200] * 2, [1.0, 1.0])
    batch = next(micro_batches(samples, size=2, pad_id=0))
    new = torch.tensor([[-2.0] * 200, [-2.0] * 200], requires_grad=True)
    cfg = loss_section(mismatch_correction=correction, mismatch_level="sequence")
    loss, stats = policy_loss(new, batch, cfg, LossNorm.for_step(cfg, samples))
    loss.backward()
    assert new.grad is not None and torch.isfinite(new.grad).all() and math.isfinite(loss.item())
    # The first sample's weight is capped at 2 (tis) or masked (mis); the second's is 0 either way.
    expected_first = -2.0 / 400 if correction == "tis" else 0.0
    torch.testing.assert_close(new.grad, torch.tensor([[expected_first] * 200, [0.0] * 200]))
    assert stats["mismatch/weight_mean"].item() == (1.0 if correction == "tis" else 0.0)
