"""The loss on the tiny Qwen3 model with a LoRA adapter: the KL penalty to the base model (the same
weights with the adapter disabled), gradient checkpointing, packed rows against padded ones, and the
RL trainer's steps."""

import json
import math
import random
from pathlib import Path

import peft
import pytest
import torch
from pydantic import TypeAdapter
from safetensors.torch import load_file
from transformers import PreTrainedModel

from lorarl.config.algorithms import LossBase, LossConfig
from lorarl.config.model import LoraConfig
from lorarl.config.run import RLConfig
from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder
from lorarl.tiny_model import build_model, build_tokenizer
from lorarl.trainer.batching import TrainSample, micro_batches
from lorarl.trainer.loss import LossNorm, micro_batch_loss, policy_loss, token_logprobs
from lorarl.trainer.model import apply_lora, enable_gradient_checkpointing
from lorarl.trainer.packing import PackedBatch
from lorarl.trainer.rl import policy_gradient_loss, train
from lorarl.trainer.trainer import forward_backward_step, forward_passes

TEMPERATURE = 0.8

LOSS: TypeAdapter[LossBase] = TypeAdapter(LossConfig)


def loss_section(**keys: object) -> LossBase:
    """A [trainer.loss] section; "ppo" unless `keys` give a type."""
    return LOSS.validate_python({"type": "ppo", **keys})


def tiny_qwen3() -> PreTrainedModel:
    tok = build_tokenizer()
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    return build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2)


def trained_adapter(model: PreTrainedModel, lora: LoraConfig | None = None) -> peft.PeftModel:
    """A LoRA adapter (rank 4 unless `lora`) that moves the policy away from the base model (a fresh one
    has B = 0)."""
    peft_model = apply_lora(model, lora or LoraConfig(rank=4))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    return peft_model


def rollout_samples() -> list[TrainSample]:
    rng = torch.Generator().manual_seed(0)
    samples = []
    for prompt_len, completion_len, adv in ((5, 7, 1.0), (3, 9, -0.5), (6, 4, 0.25)):
        ids = torch.randint(3, 250, (prompt_len + completion_len,), generator=rng).tolist()
        old = (-torch.rand(completion_len, generator=rng) * 3).tolist()
        samples.append(TrainSample(ids, [False] * prompt_len + [True] * completion_len, [0.0] * prompt_len + old,
                                   advantage=adv, temperature=TEMPERATURE))  # fmt: skip
    return samples


def test_kl_to_base_is_against_the_model_with_its_adapter_disabled() -> None:
    samples = rollout_samples()
    batch = next(micro_batches(samples, size=len(samples), pad_id=0))
    cfg = loss_section(kl_coef=0.5)
    norm = LossNorm.for_step(cfg, samples)
    base = tiny_qwen3()
    with torch.no_grad():
        base_logprobs = token_logprobs(base, batch)  # before the adapter exists
    model = trained_adapter(base)

    loss, stats = micro_batch_loss(model, batch, cfg, norm)
    expected, expected_stats = policy_loss(token_logprobs(model, batch), batch, cfg, norm, base_logprobs)
    assert math.isclose(loss.item(), expected.item(), rel_tol=1e-5)
    policy = token_logprobs(model, batch)
    k3 = [
        math.exp(r - p) - (r - p) - 1
        for rr, pr, mr in zip(base_logprobs.tolist(), policy.tolist(), batch.loss_mask.tolist(), strict=True)
        for r, p, m in zip(rr, pr, mr, strict=True)
        if m
    ]
    assert stats["kl_to_base"].item() > 1e-4
    assert math.isclose(stats["kl_to_base"].item(), sum(k3) / len(k3), rel_tol=1e-4)
    assert math.isclose(stats["kl_to_base"].item(), expected_stats["kl_to_base"].item(), rel_tol=1e-5)
    assert stats["entropy"].item() > 0
    # The adapter is enabled again afterwards.
    assert torch.equal(token_logprobs(model, batch), policy)

    # Without the penalty the base model is not run, and the stat is absent.
    _, stats = micro_batch_loss(model, batch, loss_section(), norm)
    assert "kl_to_base" not in stats


def loss_and_grads(checkpointing: bool) -> tuple[float, dict[str, torch.Tensor], int]:
    model = trained_adapter(tiny_qwen3())
    if checkpointing:
        enable_gradient_checkpointing(model)
    # Count the runs of one layer's MLP (a forward hook would not see the recomputation).
    mlp = model.base_model.model.model.layers[0].mlp
    mlp_forward = mlp.forward
    layer_calls = 0

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        nonlocal layer_calls
        layer_calls += 1
        return mlp_forward(*args, **kwargs)

    mlp.forward = counted
    model.train()
    samples = rollout_samples()
    cfg = loss_section(kl_coef=0.1)
    norm = LossNorm.for_step(cfg, samples)
    total = 0.0
    for mb in micro_batches(samples, size=2, pad_id=0):
        loss, _ = micro_batch_loss(model, mb, cfg, norm)
        loss.backward()
        total += loss.item()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return total, grads, layer_calls


def test_gradient_checkpointing_gives_the_same_loss_and_gradients() -> None:
    loss, grads, calls = loss_and_grads(checkpointing=False)
    loss_ckpt, grads_ckpt, calls_ckpt = loss_and_grads(checkpointing=True)
    # Two micro-batches, each a base-model and a policy forward; with checkpointing the policy
    # forward of each layer runs again in the backward pass.
    assert (calls, calls_ckpt) == (4, 6)
    assert math.isclose(loss, loss_ckpt, rel_tol=1e-6)
    assert grads.keys() == grads_ckpt.keys() and len(grads) == 2 * 2 * 7  # layers x (A, B) x projections
    for name, g in grads.items():
        assert g.abs().sum() > 0, name
        assert torch.allclose(g, grads_ckpt[name], rtol=1e-5, atol=1e-7), name


VARIANTS = [
    {"ratio_level": level, "type": mode, "norm": norm, "kl_coef": kl}
    for level in ("token", "sequence")
    for mode in ("ppo", "mask")
    for norm in ("token", "sequence", "constant")
    for kl in (0.0, 0.3)
]
# CISPO, the mismatch corrections (a cap of 1.3 that some token weights, of noise sd 0.25, pass), the
# entropy bonus (its gradient through the model) and a custom loss (test_loss.token_clip_loss).
VARIANTS += [
    {"ratio_level": "token", "type": "cispo", "norm": "token", "kl_coef": 0.0},
    {"ratio_level": "sequence", "type": "cispo", "norm": "sequence", "kl_coef": 0.3},
    {"mismatch_correction": "tis", "mismatch_level": "token", "mismatch_cap": 1.3, "norm": "token"},
    {"mismatch_correction": "tis", "mismatch_level": "sequence", "mismatch_cap": 1.3, "norm": "sequence"},
    {"mismatch_correction": "mis", "mismatch_level": "token", "mismatch_cap": 1.3, "norm": "constant"},
    {"mismatch_correction": "mis", "mismatch_level": "sequence", "mismatch_cap": 1.3, "norm": "token", "kl_coef": 0.3},
    {"entropy_coef": 0.1, "norm": "token"},
    {"entropy_coef": 0.1, "type": "cispo", "norm": "sequence", "kl_coef": 0.3},
    {
        "type": "custom",
        "fn": "tests.unit.trainer.test_loss:token_clip_loss",
        "args": {"ratio_low": 0.2, "ratio_high": 0.28},
        "norm": "sequence",
        "kl_coef": 0.3,
    },
]
SEQ_LEN = 32


def varied_samples(model: torch.nn.Module) -> list[TrainSample]:
    """Samples of 4 to 40 tokens at two temperatures: multi-turn loss masks (an environment reply in
    the middle), one sample without a loss token, one longer than SEQ_LEN (a last environment reply
    overran it). Sampler logprobs are the policy's own plus noise, so that some token ratios fall
    outside the trust region and some inside."""
    rng = random.Random(0)
    samples = []
    for i, length in enumerate([4, 7, 9, 12, 15, 16, 18, 21, 25, 40]):
        prompt = rng.randint(1, 3)
        mask = [False] * prompt + [rng.random() < 0.8 for _ in range(length - prompt)]
        if i == 3:
            mask = [False] * length
        if i == 9:
            mask[30:] = [False] * 10
        samples.append(TrainSample([rng.randrange(3, 250) for _ in range(length)], mask, [0.0] * length,
                                   advantage=rng.uniform(-1, 1), temperature=(0.7, 1.2)[i % 2]))  # fmt: skip
    return with_sampler_logprobs(model, samples, rng)


def with_sampler_logprobs(model: torch.nn.Module, samples: list[TrainSample], rng: random.Random) -> list[TrainSample]:
    """`samples` with sampler logprobs of the policy's own plus noise (sd 0.25)."""
    with torch.no_grad():
        for s in samples:
            policy = token_logprobs(model, next(micro_batches([s], size=1, pad_id=0)))[0].tolist()
            s.old_logprobs = [0.0, *(p + rng.gauss(0, 0.25) for p in policy)]
    return samples


def step_loss_stats_and_grads(
    model: torch.nn.Module, samples: list[TrainSample], cfg: RLConfig
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The RL trainer's forward/backward of one step."""
    model.zero_grad(set_to_none=True)
    loss_tokens = sum(sum(s.loss_mask) for s in samples)
    pass_loss = policy_gradient_loss(model, samples, cfg.trainer.loss, loss_tokens, cfg.trainer.logits_chunk_size)
    shares = forward_backward_step(model, samples, pass_loss, forward_passes(cfg, pad_id=0))
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return shares, grads


def variant_config(loss: dict, packing: bool, logits_chunk_size: int = 0) -> RLConfig:
    """The RL config of a loss variant, with packing (and shared prompts) or padded rows, the output head
    applied to every target at once (0) or in chunks."""
    trainer = {
        "micro_batch_size": 2,
        "packing": packing,
        "logits_chunk_size": logits_chunk_size,
        "loss": loss | {"norm_constant": 200.0 if loss["norm"] == "constant" else None},
    }
    return RLConfig(model={"name": "tiny"}, seq_len=SEQ_LEN, trainer=trainer)


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("loss", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_a_chunked_output_head_gives_the_loss_gradients_and_stats_of_the_whole_pass(loss: dict, packing: bool) -> None:
    model = trained_adapter(tiny_qwen3())
    samples = varied_samples(model)
    # 7 targets a chunk: passes of 2 x 39 or up to 64 targets split into chunks, the last one shorter.
    chunked_stats, chunked_grads = step_loss_stats_and_grads(model, samples, variant_config(loss, packing, 7))
    whole_stats, whole_grads = step_loss_stats_and_grads(model, samples, variant_config(loss, packing, 0))
    assert_same_step(chunked_stats, chunked_grads, whole_stats, whole_grads)


def test_a_chunked_output_head_trains_a_whole_model_as_the_whole_pass_does() -> None:
    """Full fine-tuning: the output head, tied to the embeddings, gets its gradient through the chunks."""
    model = tiny_qwen3()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    samples = varied_samples(model)
    loss = {"norm": "token", "kl_coef": 0.0, "entropy_coef": 0.1}
    chunked_stats, chunked_grads = step_loss_stats_and_grads(model, samples, variant_config(loss, True, 5))
    whole_stats, whole_grads = step_loss_stats_and_grads(model, samples, variant_config(loss, True, 0))
    assert chunked_stats == pytest.approx(whole_stats, rel=1e-5, abs=1e-7)
    assert chunked_grads.keys() == whole_grads.keys() and "model.embed_tokens.weight" in whole_grads
    for name, g in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("chunk", [0, 7])
def test_a_chunked_output_head_keeps_no_logits_for_the_backward_pass(chunk: int) -> None:
    """What autograd keeps of a pass: with chunks, no tensor over the vocabulary (each chunk's logits are
    computed again in the backward pass); without, the log-distributions of all targets."""
    model = trained_adapter(tiny_qwen3())
    samples = varied_samples(model)
    batch = next(iter(forward_passes(variant_config({"norm": "token"}, True), pad_id=0).split(samples)))
    vocab = model.config.vocab_size
    head_weight = model.get_output_embeddings().weight.untyped_storage().data_ptr()
    kept: list[int] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        # Over the vocabulary, and not the output head's weight (which its matmul keeps).
        if t.dim() > 0 and t.shape[-1] == vocab and t.untyped_storage().data_ptr() != head_weight:
            kept.append(t.numel() // vocab)
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        norm = LossNorm.for_step(loss_section(), samples)
        loss, _ = micro_batch_loss(model, batch, loss_section(entropy_coef=0.1), norm, chunk)
    loss.backward()
    targets = batch.loss_mask.numel()
    assert max(kept, default=0) == (0 if chunk else targets)


@pytest.mark.parametrize("loss", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_packed_rows_give_the_loss_gradients_and_stats_of_padded_rows(loss: dict) -> None:
    model = trained_adapter(tiny_qwen3())
    samples = varied_samples(model)

    cfg = variant_config(loss, True).trainer.loss

    packed = list(forward_passes(variant_config(loss, True), pad_id=0).split(samples))
    assert all(isinstance(b, PackedBatch) for b in packed)
    # Both temperatures, rows of several samples, the long sample in a row of its own.
    assert {b.temperature for b in packed} == {0.7, 1.2}
    assert sum(b.num_samples for b in packed) == len(samples) > sum(b.input_ids.shape[0] for b in packed)
    assert max(b.input_ids.shape[1] for b in packed) == 40

    unpacked_stats, unpacked_grads = step_loss_stats_and_grads(model, samples, variant_config(loss, False))
    packed_stats, packed_grads = step_loss_stats_and_grads(model, samples, variant_config(loss, True))
    if getattr(cfg, "ratio_level", "token") == "token" and cfg.mismatch_correction == "none" and cfg.type != "custom":
        assert 0.05 < unpacked_stats["ratio/out_of_range_frac"] < 0.95
    if cfg.mismatch_correction != "none":
        flagged = "mismatch/capped_frac" if cfg.mismatch_correction == "tis" else "mismatch/masked_frac"
        assert 0.05 < unpacked_stats[flagged] < 0.95
    if cfg.type == "custom":
        assert 0.05 < unpacked_stats["loss_fn/clipped_frac"] < 0.95
    assert ("kl_to_base" in packed_stats) == (cfg.kl_coef > 0)
    assert_same_step(packed_stats, packed_grads, unpacked_stats, unpacked_grads)


def assert_same_step(
    stats: dict[str, float], grads: dict[str, torch.Tensor], want_stats: dict[str, float],
    want_grads: dict[str, torch.Tensor],
) -> None:  # fmt: skip
    """One step's stats and (non-zero) LoRA gradients, as those of the padded rows, up to float rounding."""
    assert stats.keys() == want_stats.keys()
    for key, value in want_stats.items():
        assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert grads.keys() == want_grads.keys() and len(grads) == 2 * 2 * 7
    for name, g in want_grads.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def grouped_samples(model: torch.nn.Module) -> list[TrainSample]:
    """Three groups of 4 rollouts that share their prompt, completions of 3 to 12 tokens at two
    temperatures (one rollout with an environment reply in its middle), sampler logprobs as in
    `varied_samples`."""
    rng = random.Random(1)
    samples = []
    for g in range(3):
        prompt = [rng.randrange(3, 250) for _ in range(rng.randint(4, 10))]
        for i in range(4):
            n = rng.randint(3, 12)
            mask = [False] * len(prompt) + [True] * n
            if i == 1:
                mask[len(prompt) + 1 : len(prompt) + 3] = [False, False]
            samples.append(TrainSample(prompt + [rng.randrange(3, 250) for _ in range(n)], mask, [0.0] * len(mask),
                                       advantage=rng.uniform(-1, 1), temperature=(0.7, 1.2)[g % 2]))  # fmt: skip
    return with_sampler_logprobs(model, samples, rng)


@pytest.mark.parametrize("loss", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_shared_prompts_give_the_loss_gradients_and_stats_of_padded_rows(loss: dict) -> None:
    model = trained_adapter(tiny_qwen3())
    samples = grouped_samples(model)

    passes = forward_passes(variant_config(loss, True), pad_id=0)
    assert passes.share_prompts
    shared = list(passes.split(samples))
    assert all(isinstance(b, PackedBatch) and not torch.equal(b.prefix_ids, b.sequence_ids) for b in shared)
    assert sum(b.input_ids.numel() for b in shared) < sum(len(s.input_ids) for s in samples)

    padded_stats, padded_grads = step_loss_stats_and_grads(model, samples, variant_config(loss, False))
    shared_stats, shared_grads = step_loss_stats_and_grads(model, samples, variant_config(loss, True))
    assert_same_step(shared_stats, shared_grads, padded_stats, padded_grads)


def rollouts_for(step: int) -> list[Rollout]:
    return [
        Rollout(
            prompt_ids=s.input_ids[:3],
            completion_ids=s.input_ids[3:],
            completion_logprobs=s.old_logprobs[3:],
            completion_mask=s.loss_mask[3:],
            advantage=s.advantage,
            reward=0.0,
            policy_version=step - 1,
            temperature=s.temperature,
        )
        for s in rollout_samples()
    ]


@pytest.mark.parametrize(
    "loss",
    [
        {"kl_coef": 0.1, "norm": "sequence", "ratio_level": "sequence"},
        {"norm": "constant", "norm_constant": 64.0, "type": "mask"},
        {"mismatch_correction": "tis", "mismatch_level": "sequence", "entropy_coef": 0.01},
    ],
)
@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_trainer_steps_on_written_rollouts_log_the_loss_metrics(tiny_model: Path, tmp_path: Path, loss: dict) -> None:
    """The RL trainer loop (no vLLM: the rollout batches are written by hand), with checkpointing,
    with packing and without: the same metrics and adapters."""
    runs = {}
    for packing in (True, False):
        # Packed, the three samples (34 tokens) share one row of one forward pass; padded, two passes.
        trainer = {"micro_batch_size": 3 if packing else 2, "gradient_checkpointing": True, "packing": packing}
        cfg = RLConfig(model={"name": str(tiny_model)}, max_steps=2, output_dir=tmp_path, run_name=f"packing-{packing}",
                       monitor={"console": False}, trainer=trainer | {"loss": loss})  # fmt: skip
        rows_per_pass = [b.input_ids.shape[0] for b in forward_passes(cfg, pad_id=0).split(rollout_samples())]
        assert rows_per_pass == ([1] if packing else [2, 1])
        run = RunFolder(cfg.run_dir).create()
        for step in (1, 2):
            RolloutBatch(step, rollouts_for(step)).write(run.rollouts(step))
        train(cfg)
        rows = [json.loads(line) for line in run.metrics.read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        for row in rows:
            assert row["entropy"] > 0 and row["memory/peak_gib"] > 0 and math.isfinite(row["loss"])
            assert ("kl_to_base" in row) == ("kl_coef" in loss)
            assert ("mismatch/capped_frac" in row) == ("mismatch/weight_mean" in row) == ("mismatch_correction" in loss)
        assert (run.broadcast(2) / "adapter_model.safetensors").is_file()
        runs[packing] = run, rows

    (packed_run, packed_rows), (run, rows) = runs[True], runs[False]
    for packed_row, row in zip(packed_rows, rows, strict=True):
        for key in ("loss", "grad_norm", "entropy", "ratio/mean", "mismatch/logprob_abs_diff", "kl_to_base",
                    "mismatch/capped_frac", "mismatch/weight_mean"):  # fmt: skip
            if key in row:
                assert packed_row[key] == pytest.approx(row[key], rel=1e-5, abs=1e-7), key
    a = load_file(run.broadcast(2) / "adapter_model.safetensors")
    b = load_file(packed_run.broadcast(2) / "adapter_model.safetensors")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_a_resumed_run_trains_the_same_adapter_as_an_uninterrupted_one(tiny_model: Path, tmp_path: Path) -> None:
    """Stopped after step 2 (its checkpoint), resumed, fed the same batch 3: the same step-3 adapter."""

    def run_to(out: Path, max_steps: int, resume: bool = False) -> RunFolder:
        cfg = RLConfig(model={"name": str(tiny_model), "lora": {"dropout": 0.1}}, max_steps=max_steps,
                       output_dir=out, monitor={"console": False}, resume={} if resume else None,
                       trainer={"micro_batch_size": 2, "ckpt": {"interval": 2}})  # fmt: skip
        run = RunFolder(cfg.run_dir).create()
        for step in range(1, 4):
            rollouts = [
                Rollout(prompt_ids=s.input_ids[:3], completion_ids=s.input_ids[3:],
                        completion_logprobs=s.old_logprobs[3:], completion_mask=s.loss_mask[3:],
                        advantage=s.advantage * step, reward=0.0, policy_version=step - 1, temperature=s.temperature)
                for s in rollout_samples()
            ]  # fmt: skip
            RolloutBatch(step, rollouts).write(run.rollouts(step))
        train(cfg)
        return run

    straight = run_to(tmp_path / "straight", 3)
    run_to(tmp_path / "stopped", 2)
    resumed = run_to(tmp_path / "stopped", 3, resume=True)
    a = load_file(straight.broadcast(3) / "adapter_model.safetensors")
    b = load_file(resumed.broadcast(3) / "adapter_model.safetensors")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0)
    # The resumed run logged step 3 once, after steps 1-2 of the first run.
    steps = [json.loads(line)["step"] for line in resumed.metrics.read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_an_empty_batch_changes_no_weight_and_the_schedule_goes_on(tiny_model: Path, tmp_path: Path) -> None:
    """Every group of step 2 had zero advantage (orchestrator.skip_zero_advantage): its batch is empty.
    The trainer takes no forward pass and no optimizer step, writes the same adapter as version 2, and
    step 3 trains at step 3's learning rate as it would have."""
    cfg = RLConfig(model={"name": str(tiny_model)}, max_steps=3, output_dir=tmp_path, monitor={"console": False},
                   trainer={"scheduler": {"type": "linear"}, "keep_rollouts": True})  # fmt: skip
    run = RunFolder(cfg.run_dir).create()
    for step in (1, 2, 3):
        RolloutBatch(step, rollouts_for(step) if step != 2 else []).write(run.rollouts(step))
    train(cfg)
    rows = {r["step"]: r for r in map(json.loads, run.metrics.read_text().splitlines())}
    assert rows[2]["loss"] == 0.0 and rows[2]["grad_norm"] == 0.0 and rows[2]["samples"] == 0
    assert rows[2]["tokens"] == 0 and "policy_lag/mean" not in rows[2] and rows[2]["skipped_steps"] == 0
    assert [rows[s]["lr"] for s in (1, 2, 3)] == pytest.approx([5e-5, 5e-5 * 2 / 3, 5e-5 / 3])
    assert rows[3]["grad_norm"] > 0 and rows[3]["samples"] == len(rollout_samples())
    one, two, three = (load_file(run.broadcast(s) / "adapter_model.safetensors") for s in (1, 2, 3))
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=0)
    assert any(not torch.equal(three[key], two[key]) for key in one)
