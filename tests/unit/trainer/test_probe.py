"""The served-adapter check's probe on the trainer's side (trainer/served_probe.py), with a real tiny model,
tokenizer and PEFT adapter."""

from __future__ import annotations

import json
from pathlib import Path

import peft
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lorarl.config.run import RLConfig
from lorarl.orchestrator.served_check import max_abs_diff
from lorarl.run_folder import PROBE_FILE
from lorarl.trainer.broadcast import write_policy
from lorarl.trainer.served_probe import PROBE_CHATS, attach_probe, build_probe, score_probe


def lora_model(tiny_model: Path, dropout: float = 0.0) -> peft.PeftModel:
    base = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=dropout)
    return peft.get_peft_model(base, config)


def rl_config(tiny_model: Path, tmp_path: Path, **inference: object) -> RLConfig:
    return RLConfig.model_validate(
        {"model": {"name": str(tiny_model)}, "output_dir": str(tmp_path), "inference": inference}
    )


def test_the_probe_is_each_chat_through_the_template_cut_to_max_len(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    sequences = build_probe(tokenizer, max_len=1000)
    assert len(sequences) == len(PROBE_CHATS)
    for (user, assistant), ids in zip(PROBE_CHATS, sequences, strict=True):
        text = tokenizer.decode(ids)
        assert user in text and assistant in text
    assert [len(s) for s in build_probe(tokenizer, max_len=5)] == [5] * len(PROBE_CHATS)


def test_scores_are_the_logprobs_of_each_next_token_without_dropout(tiny_model: Path) -> None:
    model = lora_model(tiny_model, dropout=0.5)
    model.train()
    sequences = [[1, 2, 3, 4, 5], [7, 8, 9]]
    scores = score_probe(model, sequences)
    assert model.training  # left as it was
    assert score_probe(model, sequences) == scores  # no dropout: the same every time
    with torch.no_grad():
        model.eval()
        logits = model(input_ids=torch.tensor([sequences[0]])).logits[0].float()
    expected = torch.log_softmax(logits[:-1], -1)[torch.arange(4), torch.tensor(sequences[0][1:])]
    torch.testing.assert_close(torch.tensor(scores[0]), expected)
    assert [len(s) for s in scores] == [4, 2]


def test_each_version_written_carries_its_logprobs_beside_the_base(tiny_model: Path, tmp_path: Path) -> None:
    model = lora_model(tiny_model)
    attach_probe(model, rl_config(tiny_model, tmp_path))
    write_policy(model, tmp_path / "step_0")
    version0 = json.loads((tmp_path / "step_0" / PROBE_FILE).read_text())
    assert version0["logprobs"] == version0["base"]  # lora_B starts at zero: the base model
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.1)
    write_policy(model, tmp_path / "step_1")
    version1 = json.loads((tmp_path / "step_1" / PROBE_FILE).read_text())
    assert version1["base"] == version0["base"] and version1["sequences"] == version0["sequences"]
    gap = max_abs_diff(version1["logprobs"], version0["logprobs"])
    assert gap > 1e-3
    assert sum(len(s) for s in version0["sequences"]) >= 50  # tens to hundreds of tokens


def test_no_probe_with_the_check_off(tiny_model: Path, tmp_path: Path) -> None:
    model = lora_model(tiny_model)
    attach_probe(model, rl_config(tiny_model, tmp_path, served_check="off"))
    write_policy(model, tmp_path / "step_0")
    assert not (tmp_path / "step_0" / PROBE_FILE).exists()
