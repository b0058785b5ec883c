import random
from collections.abc import Sequence

import pytest
import torch

from lorarl.tiny_model import build_model, build_tokenizer
from lorarl.trainer.attention import Segments
from lorarl.trainer.batching import MicroBatch, TrainSample, micro_batches
from lorarl.trainer.loss import token_logprobs
from lorarl.trainer.packing import (
    PackedBatch,
    SharedPrompt,
    collate_packed,
    least_padded_rows,
    pack_rows,
    packed_micro_batches,
    shared_prompts,
)


def test_pack_rows_fills_rows_first_fit_decreasing() -> None:
    lengths = [5, 9, 3, 7, 2, 10, 1]
    rows = pack_rows(lengths, capacity=10)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 10 for row in rows)
    # 37 tokens need 4 rows of 10; first-fit decreasing finds them.
    assert rows == [[5], [1, 6], [3, 2], [0, 4]]
    with pytest.raises(ValueError, match="11 tokens does not fit in a row of 10"):
        pack_rows([3, 11], capacity=10)


def test_rows_are_as_wide_as_pays_off() -> None:
    # Two short samples would share a row of 128, and widen every row of the micro-batch to ~128.
    lengths = [70] * 30 + [56, 58]
    rows = least_padded_rows(lengths, capacity=128, rows_per_batch=32)
    assert sorted(len(row) for row in rows) == [1] * 32
    # Short samples fill whole rows: 8 samples of 20 to 32 tokens in 2 rows.
    rows = least_padded_rows([20, 32, 25, 31, 28, 30, 27, 29], capacity=128, rows_per_batch=32)
    assert sorted(len(row) for row in rows) == [4, 4]
    # Rows come longest first, so each micro-batch is padded to rows of about its own length.
    rows = least_padded_rows([10, 50, 20, 40], capacity=50, rows_per_batch=2)
    assert [sum([10, 50, 20, 40][i] for i in row) for row in rows] == [50, 50, 20]


def test_collate_restarts_positions_and_masks_sample_starts() -> None:
    a = TrainSample([1, 2, 3], [True, True, True], [-0.1, -0.2, -0.3], advantage=2.0)
    b = TrainSample([4, 5], [False, True], [0.0, -0.5], advantage=-1.0)
    c = TrainSample([6, 7], [True, True], [-0.6, -0.7], advantage=0.5)
    batch = collate_packed([[a, b], [c]], pad_id=0, temperature=0.7)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]
    assert batch.sequence_ids.tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]]
    # Aligned with the targets input_ids[:, 1:]; predicting 4 (b's first token) from 3 carries no loss.
    assert batch.loss_mask.tolist() == [[True, True, False, True], [True, False, False, False]]
    assert torch.allclose(batch.old_logprobs, torch.tensor([[-0.2, -0.3, 0.0, -0.5], [-0.7, 0, 0, 0]]))
    assert batch.token_advantages.tolist() == [[2.0, 2.0, -1.0, -1.0], [0.5, 0.0, 0.0, 0.0]]
    # Each target's sample, numbered across the batch; the padding counts with its row's last sample.
    assert batch.sample_index.tolist() == [[0, 0, 1, 1], [2, 2, 2, 2]]
    assert batch.temperature == 0.7 and batch.num_samples == 3
    mask = batch.attention_mask("sdpa", torch.float32)
    assert mask is not None and mask.shape == (2, 1, 5, 5)
    assert mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],  # b sees nothing of a
        [0, 0, 0, 1, 1],
    ]
    eager = batch.attention_mask("eager", torch.float32)
    assert eager is not None and torch.equal(eager == 0, mask)
    # Flash attention finds the boundaries from the position ids.
    assert batch.attention_mask("flash_attention_2", torch.float32) is None


def random_samples(n: int, vocab: int, seed: int) -> list[TrainSample]:
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        length = rng.randint(2, 30)
        samples.append(
            TrainSample(
                input_ids=[rng.randrange(3, vocab) for _ in range(length)],
                loss_mask=[rng.random() < 0.7 for _ in range(length)],
                old_logprobs=[-rng.random() for _ in range(length)],
                advantage=rng.uniform(-1, 1),
                temperature=0.7,
            )
        )
    return samples


def rl_style_loss(logprobs: torch.Tensor, batch: MicroBatch | PackedBatch) -> torch.Tensor:
    """A loss that uses every per-token field, so a misaligned mask, logprob or advantage shows."""
    adv = batch.token_advantages
    per_token = adv * logprobs + (logprobs - batch.old_logprobs) ** 2
    return (per_token * batch.loss_mask).sum()


def loss_and_grads(
    model: torch.nn.Module, batches: Sequence[MicroBatch | PackedBatch], loss_tokens: int
) -> tuple[float, list[torch.Tensor]]:
    """The summed loss of `batches` and the gradients of the trained weights."""
    model.zero_grad()
    total = 0.0
    for mb in batches:
        logprobs = token_logprobs(model, mb)
        loss = rl_style_loss(logprobs, mb) / loss_tokens  # per-token mean over the step, as the trainers do
        loss.backward()
        total += loss.item()
    return total, [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("attn", ["packed_sdpa", "sdpa", "eager"])
def test_packed_loss_and_gradients_equal_unpacked(attn: str) -> None:
    tok = build_tokenizer()
    model = build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2)
    model.set_attn_implementation(attn)
    samples = random_samples(12, len(tok), seed=0)

    packed = list(packed_micro_batches(samples, capacity=64, rows_per_batch=2, pad_id=0))
    assert sum(b.num_samples for b in packed) == 12
    assert max(b.input_ids.shape[1] for b in packed) > 30  # rows really hold several samples
    unpacked = list(micro_batches(samples, size=4, pad_id=0))

    loss_tokens = sum(sum(s.loss_mask[1:]) for s in samples)
    packed_loss, packed_grads = loss_and_grads(model, packed, loss_tokens)
    loss, grads = loss_and_grads(model, unpacked, loss_tokens)
    # float32 summation order alone (e.g. micro-batches of 1 instead of 4) moves them about as much.
    assert packed_loss == pytest.approx(loss, rel=1e-6)
    for g_packed, g in zip(packed_grads, grads, strict=True):
        torch.testing.assert_close(g_packed, g, rtol=1e-4, atol=1e-6)


def test_a_shared_prompt_is_packed_once_and_each_sample_attends_to_it() -> None:
    # Prompt [1, 2, 3] (3 predicts each completion's first token), completions [4, 5] and [6].
    a = TrainSample([1, 2, 3, 4, 5], [False, False, False, True, True], [0, 0, 0, -0.4, -0.5], advantage=1.0)
    b = TrainSample([1, 2, 3, 6], [False, False, False, True], [0, 0, 0, -0.6], advantage=-2.0)
    c = TrainSample([7, 8], [False, True], [0.0, -0.8], advantage=0.5)
    (unit,) = shared_prompts([a, b], max_length=64)
    assert isinstance(unit, SharedPrompt) and unit.prefix_len == 2 and unit.length == 2 + 3 + 2
    batch = collate_packed([[unit, c]], pad_id=0, temperature=1.0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 3, 6, 7, 8]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1]]
    assert batch.sequence_ids.tolist() == [[0, 0, 1, 1, 1, 2, 2, 3, 3]]
    assert batch.prefix_ids.tolist() == [[0, 0, 0, 0, 0, 0, 0, 3, 3]]
    # Targets: a's 4 and 5 predicted from a's 3 and 4, b's 6 from b's own copy of 3, c's 8 from 7.
    assert batch.loss_mask.tolist() == [[False, False, True, True, False, True, False, True]]
    assert batch.token_advantages.tolist() == [[0.0, 1.0, 1.0, 1.0, -2.0, -2.0, 0.5, 0.5]]
    assert batch.sample_index.tolist() == [[0, 0, 0, 0, 1, 1, 2, 2]]
    assert torch.allclose(batch.old_logprobs, torch.tensor([[0, 0, -0.4, -0.5, 0, -0.6, 0, -0.8]]))
    assert batch.num_samples == 3
    mask = batch.attention_mask("sdpa", torch.float32)
    assert mask is not None
    assert mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 0, 0, 0],  # b sees the shared prompt and itself, nothing of a
        [1, 1, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 1, 1],
    ]
    with pytest.raises(ValueError, match="shared prompts need an attention mask"):
        batch.attention_mask("flash_attention_2", torch.float32)


def test_only_samples_with_the_same_prompt_share_it_and_long_groups_are_split() -> None:
    def sample(prompt: list[int], completion: int) -> TrainSample:
        return TrainSample(prompt + [9] * completion, [False] * len(prompt) + [True] * completion)

    group = [sample([1, 2, 3, 4], 6) for _ in range(5)]  # a shared prompt of 3, and 7 tokens each
    other = sample([1, 2, 5, 4], 6)  # another prompt
    alone = sample([1, 2, 6, 4], 6)
    no_loss = TrainSample([1, 2, 3, 4], [False] * 4)
    units = shared_prompts([*group, other, alone, no_loss, sample([1, 2, 5, 4], 2)], max_length=3 + 2 * 7)
    shared = [u for u in units if isinstance(u, SharedPrompt)]
    # 5 of one prompt in rows of at most 2: 2 + 2 + 1 (the last one packed whole).
    assert [len(u.samples) for u in shared] == [2, 2, 2]
    assert sum(u is s for u in units for s in group) == 1
    assert alone in units and no_loss in units
    assert sorted(len(u.samples) if isinstance(u, SharedPrompt) else 1 for u in units) == [1, 1, 1, 2, 2, 2]


def grouped_samples(vocab: int, seed: int) -> list[TrainSample]:
    """Four groups of 3 to 5 rollouts that share their prompt, with multi-turn loss masks."""
    rng = random.Random(seed)
    samples = []
    for _ in range(4):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 12))]
        for _ in range(rng.randint(3, 5)):
            length = rng.randint(2, 15)
            samples.append(
                TrainSample(
                    input_ids=prompt + [rng.randrange(3, vocab) for _ in range(length)],
                    loss_mask=[False] * len(prompt) + [True] + [rng.random() < 0.7 for _ in range(length - 1)],
                    old_logprobs=[0.0] * len(prompt) + [-rng.random() for _ in range(length)],
                    advantage=rng.uniform(-1, 1),
                    temperature=0.7,
                )
            )
    return samples


@pytest.mark.parametrize("attn", ["packed_sdpa", "sdpa", "eager"])
def test_shared_prompts_give_the_loss_and_gradients_of_unpacked_rows_in_fewer_tokens(attn: str) -> None:
    tok = build_tokenizer()
    model = build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2)
    model.set_attn_implementation(attn)
    samples = grouped_samples(len(tok), seed=1) + random_samples(3, len(tok), seed=2)

    shared = list(packed_micro_batches(samples, capacity=32, rows_per_batch=2, pad_id=0, share_prompts=True))
    plain = list(packed_micro_batches(samples, capacity=32, rows_per_batch=2, pad_id=0))
    assert sum(b.num_samples for b in shared) == len(samples)
    assert any(not torch.equal(b.prefix_ids, b.sequence_ids) for b in shared)
    # The same bound on tokens per pass; fewer tokens in all.
    assert all(b.input_ids.numel() <= 2 * 32 for b in shared)
    assert sum(b.input_ids.numel() for b in shared) < 0.8 * sum(b.input_ids.numel() for b in plain)
    # packed_sdpa's two ways with a shared prompt (attention.py): prompts shorter and longer than the rest.
    with_prompt = [
        s for b in shared for row in Segments.of(b.sequence_ids, b.prefix_ids).rows for s in row if s.prompt_len
    ]
    assert {s.prompt_len < s.end - s.start for s in with_prompt} == {True, False}

    loss_tokens = sum(sum(s.loss_mask[1:]) for s in samples)
    shared_loss, shared_grads = loss_and_grads(model, shared, loss_tokens)
    loss, grads = loss_and_grads(model, list(micro_batches(samples, size=4, pad_id=0)), loss_tokens)
    assert shared_loss == pytest.approx(loss, rel=1e-5)
    for g_shared, g in zip(shared_grads, grads, strict=True):
        torch.testing.assert_close(g_shared, g, rtol=1e-4, atol=1e-6)
