"""The attention paths for packed rows that skip what a row masks out (trainer/attention.py): their
segments and masks, and the logprobs and gradients they give against the dense-mask sdpa path."""

import pytest
import torch

from lorarl.config.model import LoraConfig
from lorarl.tiny_model import build_model, build_tokenizer
from lorarl.trainer import packing
from lorarl.trainer.attention import SEGMENTS_KWARG, Segment, Segments
from lorarl.trainer.batching import MicroBatch, TrainSample, micro_batches
from lorarl.trainer.loss import token_logprobs
from lorarl.trainer.model import apply_lora, enable_gradient_checkpointing
from lorarl.trainer.packing import PackedBatch, collate_packed, packed_micro_batches, shared_prompts
from tests.unit.trainer.test_packing import grouped_samples, loss_and_grads, random_samples


@pytest.fixture(autouse=True)
def segments_for_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """These rows are short: without this, packed_sdpa would give them the dense mask."""
    monkeypatch.setattr(packing, "DENSE_ROWS_UP_TO", 0)


def shared_prompt_batch() -> PackedBatch:
    """test_packing's row: a prompt [1, 2] shared by rollouts [3, 4, 5] and [3, 6], then a sample [7, 8]."""
    a = TrainSample([1, 2, 3, 4, 5], [False, False, False, True, True], [0, 0, 0, -0.4, -0.5], advantage=1.0)
    b = TrainSample([1, 2, 3, 6], [False, False, False, True], [0, 0, 0, -0.6], advantage=-2.0)
    c = TrainSample([7, 8], [False, True], [0.0, -0.8], advantage=0.5)
    (unit,) = shared_prompts([a, b], max_length=64)
    return collate_packed([[unit, c], [c]], pad_id=0, temperature=1.0)


def test_segments_name_each_samples_tokens_and_its_shared_prompt() -> None:
    batch = shared_prompt_batch()
    inputs = batch.attention_inputs("packed_sdpa", torch.float32, torch.device("cpu"))
    assert inputs["attention_mask"] is None
    segments = inputs[SEGMENTS_KWARG]
    assert segments.rows == [
        [Segment(0, 0, 2), Segment(0, 2, 5, 0, 2), Segment(0, 5, 7, 0, 2), Segment(0, 7, 9)],
        [Segment(1, 0, 2), Segment(1, 2, 9)],  # c, then the padding (a segment of its own)
    ]
    # b's 2 tokens see the whole prompt and themselves causally, through an additive mask made once.
    mask = segments.mask(segments.rows[0][2], torch.float32, torch.device("cpu"))
    assert (mask == 0).int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert mask.min() == torch.finfo(torch.float32).min
    assert segments.mask(segments.rows[0][2], torch.float32, torch.device("cpu")) is mask


def test_short_rows_get_the_dense_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = shared_prompt_batch()
    monkeypatch.setattr(packing, "DENSE_ROWS_UP_TO", batch.input_ids.shape[1])
    inputs = batch.attention_inputs("packed_sdpa", torch.float32, torch.device("cpu"))
    assert SEGMENTS_KWARG not in inputs
    assert torch.equal(inputs["attention_mask"], batch.attention_mask("sdpa", torch.float32))


def test_a_shared_prompt_must_precede_its_samples() -> None:
    sequence = torch.tensor([[0, 0, 1, 1]])
    with pytest.raises(ValueError, match="row 0: the shared prompt of tokens 0-2 does not precede them"):
        Segments.of(sequence, torch.tensor([[1, 1, 1, 1]]))


def tiny_model() -> torch.nn.Module:
    tok = build_tokenizer()
    return build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_packed_sdpa_with_gradient_checkpointing_trains_as_the_dense_mask_does(lora: bool) -> None:
    torch.manual_seed(0)
    model = tiny_model()
    if lora:
        model = apply_lora(model, LoraConfig())
        for name, p in model.named_parameters():
            if "lora_B" in name:  # not 0 as PEFT starts it, so that every weight's gradient shows
                torch.nn.init.normal_(p, std=0.1)
    samples = grouped_samples(model.config.vocab_size, seed=3) + random_samples(3, model.config.vocab_size, seed=4)
    shared = list(packed_micro_batches(samples, capacity=32, rows_per_batch=2, pad_id=0, share_prompts=True))
    padded = list(micro_batches(samples, size=4, pad_id=0))  # packed_sdpa hands these to sdpa
    batches: list[MicroBatch | PackedBatch] = [*shared, *padded]
    model.set_attn_implementation("sdpa")
    dense_loss, dense_grads = loss_and_grads(model, batches, loss_tokens=100)

    model.set_attn_implementation("packed_sdpa")
    enable_gradient_checkpointing(model)
    model.train()
    loss, grads = loss_and_grads(model, batches, loss_tokens=100)
    assert loss == pytest.approx(dense_loss, rel=1e-6)
    for g, g_dense in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(g, g_dense, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_flex_attention_gives_the_logprobs_of_the_dense_mask_and_does_not_train_on_the_cpu() -> None:
    model = tiny_model()
    samples = grouped_samples(model.config.vocab_size, seed=1) + random_samples(3, model.config.vocab_size, seed=2)
    batches = list(packed_micro_batches(samples, capacity=32, rows_per_batch=2, pad_id=0, share_prompts=True))
    with torch.no_grad():
        dense = [token_logprobs(model, b) for b in batches]
        model.set_attn_implementation("flex_attention")  # compiled by transformers: a few seconds on the CPU
        flex = [token_logprobs(model, b) for b in batches]
    for f, d, b in zip(flex, dense, batches, strict=True):
        torch.testing.assert_close(f[b.loss_mask], d[b.loss_mask], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="flex_attention cannot train on the CPU .*: set model.attn_implementation"):
        token_logprobs(model, batches[0])
