"""The Trainer's contract (trainer/trainer.py): a step's gradient and stats do not depend on how
its samples are split into forward passes, and data-parallel ranks share a step's samples out
without overlap or loss."""

import math
import random
from pathlib import Path

import pytest
import torch

from lorarl.config.model import LoraConfig
from lorarl.run_folder import RunFolder
from lorarl.tiny_model import build_model, build_tokenizer
from lorarl.trainer.batching import TrainSample
from lorarl.trainer.distributed import DataParallel
from lorarl.trainer.model import apply_lora, trainable_parameters
from lorarl.trainer.packing import ForwardPasses
from lorarl.trainer.sft import mean_nll
from lorarl.trainer.trainer import Trainer, forward_backward_step, rank_passes
from lorarl.trainer.update_watch import TrainingStopped, UpdateWatch


def varied_samples() -> list[TrainSample]:
    rng = random.Random(0)
    lengths = [5, 9, 12, 7, 16, 3, 11]
    return [
        TrainSample(
            [rng.randrange(3, 250) for _ in range(n)], [False, False] + [rng.random() < 0.7 for _ in range(n - 2)]
        )
        for n in lengths
    ]


def step_loss_and_grads(passes: ForwardPasses) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = apply_lora(build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2),
                       LoraConfig(rank=4))  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)  # a fresh adapter (B = 0) would give lora_A no gradient
    samples = varied_samples()
    totals = forward_backward_step(model, samples, mean_nll(model, samples), passes)
    return totals, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "passes",
    [
        ForwardPasses(packing=False, seq_len=32, micro_batch_size=2, pad_id=0),
        ForwardPasses(packing=False, seq_len=32, micro_batch_size=1, pad_id=0),
        ForwardPasses(packing=True, seq_len=20, micro_batch_size=1, pad_id=0),
    ],
    ids=["padded-by-2", "padded-by-1", "packed"],
)
def test_a_step_has_the_same_loss_and_gradient_in_one_forward_pass_or_several(passes: ForwardPasses) -> None:
    whole, whole_grads = step_loss_and_grads(ForwardPasses(packing=False, seq_len=32, micro_batch_size=7, pad_id=0))
    split, split_grads = step_loss_and_grads(passes)
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    # The loop's stats add up over passes: one pass pads every sample to the longest.
    assert whole["padded_tokens"] == 7 * 16
    assert split["padded_tokens"] < whole["padded_tokens"]
    assert split_grads.keys() == whole_grads.keys() and len(whole_grads) == 2 * 2 * 7
    for name, grad in whole_grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_ranks_take_every_sample_of_a_step_once() -> None:
    samples = [TrainSample([i] * (i + 2), [False] * (i + 2)) for i in range(7)]  # each marked by its token
    passes = ForwardPasses(packing=False, seq_len=32, micro_batch_size=2, pad_id=0)
    device_of = torch.nn.Linear(1, 1)  # rank_passes asks a model for the device only
    seen = []
    for rank in (0, 1):
        batches = list(rank_passes(device_of, samples, passes, DataParallel(rank, world_size=2), split_at_most=3))
        # Rank 0's share, 4 samples, is split 3 then 1, in passes of at most 2; rank 1's 3 at once.
        assert [b.input_ids.shape[0] for b in batches] == ([2, 1, 1] if rank == 0 else [2, 1])
        seen += [int(row[0]) for b in batches for row in b.input_ids]
    assert sorted(seen) == list(range(7))


def lora_trainer(tmp_path: Path, lr: float = 0.1) -> tuple[Trainer, list[torch.nn.Parameter]]:
    """A Trainer on a tiny LoRA model, stepped by hand: gradients are set, not computed."""
    tok = build_tokenizer()
    model = apply_lora(build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2),
                       LoraConfig(rank=4))  # fmt: skip
    params = list(trainable_parameters(model))
    optimizer = torch.optim.AdamW(params, lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trainer = Trainer(RunFolder(tmp_path), DataParallel(), model, optimizer, scheduler,
                      ForwardPasses(True, 64, 2, 0), 1.0, None, UpdateWatch(max_skipped_steps=2))  # fmt: skip
    return trainer, params


def step_with(
    trainer: Trainer,
    params: list[torch.nn.Parameter],
    step: int,
    grad: float = 0.01,
    bad: float | None = None,
    signal: bool = True,
) -> float:
    for p in params:
        p.grad = torch.full_like(p, grad)
    if bad is not None:
        params[0].grad[0, 0] = bad  # type: ignore[index]
    return trainer.optimizer_step(step, signal)[0]


def test_a_non_finite_gradient_changes_no_weight_and_too_many_in_a_row_stop_the_run(tmp_path: Path) -> None:
    trainer, params = lora_trainer(tmp_path)
    before = [p.detach().clone() for p in params]
    assert math.isnan(step_with(trainer, params, 1, bad=float("nan")))
    assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True)) and trainer.watch.skipped_steps == 1
    step_with(trainer, params, 2)  # a finite step updates, and ends the run of skipped steps
    assert not torch.equal(before[0], params[0]) and trainer.watch.skipped_in_a_row == 0
    step_with(trainer, params, 3, bad=float("inf"))
    stop = "step 4: the loss or gradient was NaN or infinite 2 steps in a row .* since step 2; lower optim.lr"
    with pytest.raises(TrainingStopped, match=stop):
        step_with(trainer, params, 4, bad=float("nan"))
    assert trainer.watch.skipped_steps == 3 and all(torch.isfinite(p).all() for p in params)


@pytest.mark.parametrize("found_by", ["check_weights", "next_step"])
def test_an_update_that_makes_weights_non_finite_stops_the_run_before_they_are_read(
    tmp_path: Path, found_by: str
) -> None:
    """Finite gradients at a learning rate near float32's range: Adam's second update, the first's
    size again, takes the weights past it. The check is read with the next step's gradient norm, or
    by check_weights before anything is written."""
    trainer, params = lora_trainer(tmp_path, lr=3e37)
    step_with(trainer, params, 1, grad=1.0)
    step_with(trainer, params, 2, grad=1.0)  # reads step 1's check: finite
    assert not all(torch.isfinite(p).all() for p in params)
    stop = r"^step 2: the update made weights NaN or infinite \(lr 3e\+37\); lower optim.lr and start again"
    with pytest.raises(TrainingStopped, match=stop):
        trainer.check_weights() if found_by == "check_weights" else step_with(trainer, params, 3)


def test_finite_updates_pass_the_check_and_it_is_read_once(tmp_path: Path) -> None:
    trainer, params = lora_trainer(tmp_path)
    step_with(trainer, params, 1)
    assert trainer.watch.unchecked is not None and trainer.watch.unchecked[0] == 1
    trainer.check_weights()
    largest = max(p.abs().max().item() for p in params)
    assert trainer.watch.unchecked is None and trainer.watch.largest_weight == pytest.approx(largest)
    step_with(trainer, params, 2)
    step_with(trainer, params, 3)  # reads step 2's check with its gradient norm
    assert trainer.watch.unchecked is not None and trainer.watch.unchecked[0] == 3


def test_a_gradient_stuck_at_zero_with_a_loss_to_learn_is_said_once_then_stops_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, params = lora_trainer(tmp_path)
    # Before any step had a gradient (a fresh run whose first batch teaches nothing), or without
    # anything to learn (RL: advantages all 0), a zero gradient is no sign of saturated weights.
    step_with(trainer, params, 1, grad=0.0)
    step_with(trainer, params, 2, grad=0.0)
    step_with(trainer, params, 3)
    step_with(trainer, params, 4, grad=0.0, signal=False)
    step_with(trainer, params, 5, grad=0.0, signal=False)
    assert trainer.watch.zero_in_a_row == 0 and "gradient norm exactly 0" not in caplog.text
    step_with(trainer, params, 6, grad=0.0)  # one alone may be sound: said, and the run goes on
    step_with(trainer, params, 7)
    step_with(trainer, params, 8, grad=0.0)
    assert caplog.text.count("gradient norm exactly 0") == 1 and "step 6" in caplog.text
    stop = (
        r"step 9: the gradient norm was exactly 0 for 2 steps in a row although they had a loss to learn from "
        r"\(optim.max_skipped_steps\): the weights are saturated \(largest \|weight\| 0\.\d+\).*lower optim.lr"
    )
    with pytest.raises(TrainingStopped, match=stop):
        step_with(trainer, params, 9, grad=0.0)
