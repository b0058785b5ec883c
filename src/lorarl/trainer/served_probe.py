"""The served-adapter check's probe, on the trainer's side (docs/served_check.md).

The orchestrator checks every policy version on every worker by scoring a small fixed probe through
the served adapter and comparing with the trainer's logprobs of the same tokens. This module builds
the probe (a few chat-templated exchanges, teacher-forced: a few hundred tokens in all) and scores it
with the trainer's model under the version being written and, once, under the base model. Both go
into each broadcast folder (run_folder.PROBE_FILE), so that every check reads one file written with its
adapter, whichever role (or variant) wrote it. It costs one no_grad forward pass of a small batch per
broadcast.

The probe is fixed text, not drawn from the run's environments: the trainer runs without them (the
standalone `lorarl-trainer` role), and what the check needs is tokens on which a trained adapter moves
the logprobs, which any chat text through the model's own template gives.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any

import peft
import torch

from lorarl.config.run import RLConfig
from lorarl.config.serve import ServeConfig

PROBE_MAX_LEN = 128  # tokens of each sequence at most

# A few short exchanges through the model's chat template: system, user and assistant tokens.
PROBE_CHATS: tuple[tuple[str, str], ...] = (
    ("What is 17 times 23? Answer with the number.", "17 times 23 is 391."),
    ("Sort these letters alphabetically: q, b, m, a.", "a, b, m, q"),
    ("Name the capital of France in one word.", "Paris"),
    ("Write a Python function that returns the square of x.", "def square(x):\n    return x * x"),
)


def build_probe(tokenizer: Any, max_len: int) -> list[list[int]]:
    """The probe's token sequences: each of PROBE_CHATS through the chat template (or as plain text
    for a tokenizer without one), cut to `max_len` tokens."""
    sequences = []
    for user, assistant in PROBE_CHATS:
        chat = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(chat, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            ids = tokenizer(f"{user}\n{assistant}")["input_ids"]
        sequences.append([int(i) for i in ids][:max_len])
    return sequences


@torch.no_grad()
def score_probe(model: torch.nn.Module, sequences: list[list[int]]) -> list[list[float]]:
    """log p(token | tokens before it) of every token but the first of each sequence, in float32."""
    device = next(model.parameters()).device
    training = model.training
    model.eval()  # no dropout (LoRA's): the weights as vLLM serves them
    try:
        scores = []
        for ids in sequences:  # one at a time: no padding, a few hundred tokens in all
            tokens = torch.tensor([ids], device=device)
            logits = model(input_ids=tokens).logits[0, :-1].float()
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[0, 1:, None])[:, 0]
            scores.append(logprobs.cpu().tolist())
    finally:
        model.train(training)
    return scores


@dataclass
class Probe:
    """The probe's tokens and the base model's logprobs of them, scored once."""

    sequences: list[list[int]]
    base: list[list[float]]

    @classmethod
    def for_model(cls, model: torch.nn.Module, tokenizer: Any, max_len: int) -> Probe:
        """Scored under the base model: the adapter switched off (LoRA), or the weights as they are
        now, before any step (full fine-tuning)."""
        sequences = build_probe(tokenizer, max_len)
        if isinstance(model, peft.PeftModel):
            with model.disable_adapter():
                return cls(sequences, score_probe(model, sequences))
        return cls(sequences, score_probe(model, sequences))

    def file_text(self, model: torch.nn.Module) -> str:
        """The PROBE_FILE of the model's weights now: their logprobs beside the base's."""
        logprobs = score_probe(model, self.sequences)
        return json.dumps({"sequences": self.sequences, "logprobs": logprobs, "base": self.base})


# The probe of each model being trained (`attach_probe`), which write_policy scores with every version.
_PROBES: weakref.WeakKeyDictionary[torch.nn.Module, Probe] = weakref.WeakKeyDictionary()


def attach_probe(model: torch.nn.Module, cfg: RLConfig | ServeConfig) -> None:
    """Score the probe under the base model now, so that every version write_policy writes of `model`
    carries its PROBE_FILE; nothing with inference.served_check "off" or full fine-tuning."""
    if cfg.inference.served_check == "off" or cfg.model.full_finetune:
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name)
    # One token under seq_len: vLLM (max_model_len = seq_len) generates one after the scored prompt.
    _PROBES[model] = Probe.for_model(model, tokenizer, min(cfg.seq_len - 1, PROBE_MAX_LEN))


def probe_file_text(model: torch.nn.Module) -> str | None:
    """The PROBE_FILE of the weights `model` has now, or None if it has no probe. Call it on every
    rank: a sharded model's forward pass takes all of them."""
    probe = _PROBES.get(model)
    return None if probe is None else probe.file_text(model)
