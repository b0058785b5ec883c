import torch

from lorarl.trainer.batching import TrainSample, micro_batches


def test_micro_batches_pad_right_and_shift_masks_to_targets() -> None:
    samples = [
        TrainSample([1, 2, 3, 4], [False, False, True, True], [0.0, 0.0, -0.5, -0.6], advantage=1.0),
        TrainSample([5, 6], [False, True], [0.0, -0.9], advantage=-1.0),
        TrainSample([7, 8, 9], [False, True, True], [0.0, -0.1, -0.2], advantage=0.5),
    ]
    first, second = list(micro_batches(samples, size=2, pad_id=0))
    assert first.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert first.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    # Aligned with targets input_ids[:, 1:]: the mask says whether the *predicted* token is trained.
    assert first.loss_mask.tolist() == [[False, True, True], [True, False, False]]
    assert torch.allclose(first.old_logprobs, torch.tensor([[0.0, -0.5, -0.6], [-0.9, 0.0, 0.0]]))
    assert first.token_advantages.tolist() == [[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]]  # 0 on padding
    assert second.input_ids.tolist() == [[7, 8, 9]]


def test_micro_batches_never_mix_temperatures() -> None:
    samples = [TrainSample([1, 2], [False, True], temperature=t) for t in (1.0, 0.7, 1.0)]
    batches = list(micro_batches(samples, size=8, pad_id=0))
    assert sorted((b.temperature, b.input_ids.shape[0]) for b in batches) == [(0.7, 1), (1.0, 2)]
