import math

import torch

from lorarl.config.models import LossConfig
from lorarl.trainer.batching import TrainSample, micro_batches
from lorarl.trainer.loss import policy_loss, token_logprobs


def batch_with(old: list[list[float]], mask: list[list[bool]], advantages: list[float]):
    samples = [
        TrainSample(input_ids=[1] * (len(o) + 1), loss_mask=[False, *m], old_logprobs=[0.0, *o], advantage=a)
        for o, m, a in zip(old, mask, advantages, strict=True)
    ]
    return next(micro_batches(samples, size=len(samples), pad_id=0))


def reference_loss(new, old, mask, adv, low, high, mode):
    total, n = 0.0, sum(sum(m) for m in mask)
    for new_row, old_row, mask_row, a in zip(new, old, mask, adv, strict=True):
        for lp, olp, m in zip(new_row, old_row, mask_row, strict=True):
            if not m:
                continue
            r = math.exp(lp - olp)
            if mode == "clip":
                total += -min(r * a, min(max(r, 1 - low), 1 + high) * a)
            elif 1 - low <= r <= 1 + high:
                total += -r * a
    return total / n


def test_policy_loss_matches_a_direct_computation() -> None:
    old = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -3.0]]
    new = [[-0.5, -2.1, -0.5], [-1.0, -1.2, -2.0]]  # ratios e^0.5, e^-0.1, 1, e^-0.7, 1, e^1
    mask = [[True, True, True], [True, True, False]]
    adv = [1.5, -0.7]
    batch = batch_with(old, mask, adv)
    for mode in ("clip", "mask"):
        cfg = LossConfig(ratio_mode=mode, ratio_low=0.2, ratio_high=0.28)
        loss, stats = policy_loss(torch.tensor(new), batch, cfg, total_loss_tokens=5)
        expected = reference_loss(new, old, mask, adv, 0.2, 0.28, mode)
        assert math.isclose(loss.item(), expected, rel_tol=1e-6), (mode, loss.item(), expected)
        # Out of [0.8, 1.28] among the 5 loss tokens: e^0.5 = 1.65 and e^-0.7 = 0.50.
        assert math.isclose(stats["ratio/out_of_range_frac"].item(), 2 / 5, rel_tol=1e-6)
        assert math.isclose(stats["mismatch/logprob_abs_diff"].item(), (0.5 + 0.1 + 0 + 0.7 + 0) / 5, rel_tol=1e-5)


def test_on_policy_gradient_is_the_reinforce_gradient() -> None:
    """With ratio 1 the loss gradient w.r.t. logprobs is -A / n_tokens on every loss token."""
    old = [[-1.0, -2.0], [-0.5, -0.1]]
    batch = batch_with(old, [[True, True], [True, False]], [2.0, -1.0])
    new = torch.tensor(old, requires_grad=True)
    loss, _ = policy_loss(new, batch, LossConfig(), total_loss_tokens=3)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))


class BigramModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(10, 10))

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": self.table[input_ids]})


def test_token_logprobs_apply_the_temperature_and_align_with_targets() -> None:
    model = BigramModel()
    sample = TrainSample(input_ids=[3, 5, 7], loss_mask=[False, True, True], temperature=0.5)
    mb = next(micro_batches([sample], size=1, pad_id=0))
    lp = token_logprobs(model, mb)
    expected = [torch.log_softmax(model.table[a] / 0.5, -1)[b].item() for a, b in ((3, 5), (5, 7))]
    assert torch.allclose(lp[0], torch.tensor(expected))
