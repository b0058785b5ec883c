"""The policy gap split (trainer/policy_gap.py) against logprobs computed directly under each version."""

import torch

from lorarl.trainer.batching import TrainSample, micro_batches
from lorarl.trainer.loss import EVERY_TOKEN, token_logprobs
from lorarl.trainer.policy_gap import PolicyHistory, policy_gap
from tests.unit.trainer.test_loss import BigramModel

SEQUENCES = [[3, 5, 7, 2], [1, 4, 4, 9], [8, 0, 6, 3]]
VERSIONS = [0, 1, 1]  # the policy version that sampled each sequence
SERVING_NOISE = [0.01, -0.02, 0.03]  # what vLLM's logprob of every token of each sequence is off by


def logprobs_under(model: BigramModel, table: torch.Tensor, tokens: list[int]) -> list[float]:
    with torch.no_grad():
        model.table.copy_(table)
        sample = TrainSample(input_ids=tokens, loss_mask=[False] + [True] * (len(tokens) - 1))
        return token_logprobs(model, next(micro_batches([sample], 1, 0)))[0].tolist()


def test_the_split_is_of_the_versions_that_sampled_and_the_model_keeps_its_own_weights() -> None:
    model = BigramModel()
    tables = [model.table.detach().clone() + 0.3 * v * torch.randn(10, 10) for v in range(3)]
    history = PolicyHistory(keep=2)
    for v in range(3):  # versions 0, 1, 2, the model holding version 2 at the end
        with torch.no_grad():
            model.table.copy_(tables[v])
        history.record(model, v)
    assert sorted(history.weights) == [1, 2]  # keep = 2 versions
    # Version 0 again, as if kept (max_async_level 2).
    history.weights[0] = {"table": tables[0].clone()}
    samples, moved, serving, n = [], 0.0, 0.0, 0
    for tokens, version, noise in zip(SEQUENCES, VERSIONS, SERVING_NOISE, strict=True):
        at_version = logprobs_under(model, tables[version], tokens)
        now = logprobs_under(model, tables[1], tokens)
        vllm = [lp + noise for lp in at_version]
        samples.append(TrainSample(tokens, [False] + [True] * 3, [0.0, *vllm]))
        moved += sum(abs(a - b) for a, b in zip(now, at_version, strict=True))
        serving += abs(noise) * 3
        n += 3
    with torch.no_grad():
        model.table.copy_(tables[2])
    model.train()
    gap = policy_gap(model, history, samples, VERSIONS, 1, EVERY_TOKEN, micro_batch_size=2, chunk_size=0)
    assert gap["mismatch/policy_moved"] > 0.1
    torch.testing.assert_close(gap["mismatch/policy_moved"], moved / n, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(gap["mismatch/serving"], serving / n, rtol=1e-4, atol=1e-6)
    assert gap["mismatch/gap_left_out"] == 0
    assert torch.equal(model.table.detach(), tables[2]) and model.training


def test_samples_of_a_version_no_longer_kept_are_left_out_and_counted() -> None:
    model = BigramModel()
    history = PolicyHistory(keep=1)
    history.record(model, 5)
    samples = [TrainSample(t, [False] + [True] * 3, [0.0] * 4) for t in SEQUENCES]
    gap = policy_gap(model, history, samples, [3, 5, 5], 5, EVERY_TOKEN, micro_batch_size=4, chunk_size=0)
    assert gap["mismatch/gap_left_out"] == 1
    assert gap["mismatch/policy_moved"] == 0.0 and gap["mismatch/serving"] > 0
