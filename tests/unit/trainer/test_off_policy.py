"""The trainer's side of top_k / top_p (loss.Nucleus) against vLLM's own sampler code, and the
effective sample size of the mismatch weights (mismatch.py) against a direct computation. The loss
variants (IcePop, geometric-mean masking) are checked with the others in test_loss.py."""

import math

import pytest
import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

from lorarl.config.algorithms import PPOLoss
from lorarl.trainer.batching import TrainSample, micro_batches
from lorarl.trainer.loss import LossNorm, Nucleus, policy_loss, token_logprobs, token_logprobs_and_entropy
from lorarl.trainer.mismatch import effective_sample_size
from tests.unit.trainer.test_loss import ADV, MASK, NEW, OLD, BigramModel, on_loss_tokens, samples_with

NUCLEI = [(0.9, None), (1.0, 5), (0.7, 20), (0.95, 1), (0.5, 50)]


def vllm_processed_logprobs(logits: torch.Tensor, nucleus: Nucleus, cpu_path: bool) -> torch.Tensor:
    """What vLLM 0.32 returns with --logprobs-mode processed_logprobs for tempered `logits` [n, vocab]:
    its top-k/top-p masking (the CPU path takes the top-k-only shortcut), then log_softmax."""
    rows = logits.shape[0]
    k = None if nucleus.top_k is None else torch.full((rows,), nucleus.top_k, dtype=torch.long)
    p = None if nucleus.top_p >= 1.0 else torch.full((rows,), nucleus.top_p)
    return apply_top_k_top_p_pytorch(logits.clone(), k, p, allow_cpu_sync=cpu_path).log_softmax(dim=-1)


@pytest.mark.parametrize("cpu_path", [False, True])
@pytest.mark.parametrize(("top_p", "top_k"), NUCLEI)
def test_the_trainer_keeps_the_tokens_vllm_samples_from(top_p: float, top_k: int | None, cpu_path: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=gen) * 3
    nucleus = Nucleus(top_p, top_k)
    expected = vllm_processed_logprobs(logits, nucleus, cpu_path)
    # Targets drawn from vLLM's distribution, as sampled tokens are.
    targets = torch.multinomial(expected.exp(), 1, generator=gen).squeeze(-1)
    kept = nucleus.keep(logits, targets)
    assert torch.equal(kept.isfinite(), expected.isfinite())
    assert 0 < expected.isfinite().sum() < expected.numel()  # the case drops tokens
    torch.testing.assert_close(kept.log_softmax(dim=-1)[kept.isfinite()], expected[expected.isfinite()])


def test_a_sampled_token_the_trainer_would_drop_is_kept() -> None:
    """Float rounding may put a token at the boundary on the other side in the trainer: its logprob
    stays finite, and only it is added."""
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]])
    nucleus = Nucleus(top_p=0.5)
    assert nucleus.keep(logits, torch.tensor([0])).isfinite().tolist() == [[True, False, False, False]]
    assert nucleus.keep(logits, torch.tensor([3])).isfinite().tolist() == [[True, False, False, True]]


@pytest.mark.parametrize("chunk_size", [0, 1])
def test_token_logprobs_and_entropy_are_those_of_the_distribution_vllm_sampled_from(chunk_size: int) -> None:
    model = BigramModel()
    nucleus, temperature = Nucleus(top_p=0.8, top_k=6), 0.7
    # Each token the second most likely after the one before: vLLM keeps it whatever the nucleus.
    tokens = [3]
    for _ in range(4):
        tokens.append(int(model.table[tokens[-1]].topk(2).indices[1]))
    sample = TrainSample(input_ids=tokens, loss_mask=[False] + [True] * 4, temperature=temperature)
    batch = next(micro_batches([sample], size=1, pad_id=0))
    logprobs, entropy = token_logprobs_and_entropy(model, batch, True, chunk_size, nucleus)
    assert torch.equal(logprobs, token_logprobs(model, batch, chunk_size, nucleus))
    prev, targets = torch.tensor(tokens[:-1]), tokens[1:]
    expected = vllm_processed_logprobs(model.table[prev].detach() / temperature, nucleus, cpu_path=True)
    torch.testing.assert_close(logprobs[0], expected.gather(-1, torch.tensor(targets)[:, None]).squeeze(-1))
    kept = expected.isfinite()
    expected_entropy = -(expected.exp() * expected.where(kept, 0.0)).sum(-1)
    torch.testing.assert_close(entropy[0], expected_entropy)
    assert (kept.sum(-1) < 10).all()  # the nucleus dropped tokens at every position
    # Gradients through the renormalization are finite and stay on the kept tokens.
    (logprobs.sum() + entropy.sum()).backward()
    assert model.table.grad is not None and model.table.grad.isfinite().all()
    assert model.table.grad[prev][~kept].abs().sum() == 0


def test_the_effective_sample_size_of_the_step_is_of_its_token_weights() -> None:
    """(sum w)^2 / (n sum w^2) over the 8 loss tokens, from two micro-batches weighed by their tokens
    as the trainer sums them (rl.policy_gradient_loss)."""
    samples = samples_with(OLD, MASK, ADV)
    cfg = PPOLoss(mismatch_correction="tis")
    norm = LossNorm.for_step(cfg, samples)
    step: dict[str, float] = {}
    for i, batch in zip((0, 2), micro_batches(samples, size=2, pad_id=0), strict=True):
        _, stats = policy_loss(torch.tensor(NEW[i : i + 2]), batch, cfg, norm)
        share = batch.loss_mask.sum().item() / 8
        for key, value in stats.items():
            step[key] = step.get(key, 0.0) + value.item() * share
    w = [math.exp(n - o) for n, o in on_loss_tokens(NEW, OLD)]
    expected = sum(w) ** 2 / (len(w) * sum(x * x for x in w))
    assert 0.9 < expected < 1  # the weights differ, a little
    assert math.isclose(effective_sample_size(step)["mismatch/ess"], expected, rel_tol=1e-6)
    assert effective_sample_size({"mismatch/is_weight_mean": 1.3, "mismatch/is_weight_sq_mean": 1.69}) == {
        "mismatch/ess": pytest.approx(1.0)
    }
    assert effective_sample_size({}) == {}
