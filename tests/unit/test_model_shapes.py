"""The shape table builds each model with the parameter counts its model card publishes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lorarl.model_shapes import HUB_CONFIGS, hub_config, transformers_config

# (total, non-embedding) parameters in billions, as the Qwen3 model cards round them.
PUBLISHED = {
    "Qwen/Qwen3-0.6B": (0.6, 0.44),
    "Qwen/Qwen3-1.7B": (1.7, 1.4),
    "Qwen/Qwen3-4B": (4.0, 3.6),
    "Qwen/Qwen3-8B": (8.2, 6.95),
    "Qwen/Qwen3-14B": (14.8, 13.2),
    "Qwen/Qwen3-32B": (32.8, 31.2),
    "Qwen/Qwen3-4B-Instruct-2507": (4.0, 3.6),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": (7.6, 6.5),
    "Qwen/Qwen3-30B-A3B": (30.5, 29.9),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_counts_match_the_model_cards(name: str) -> None:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(transformers_config(name))
    total = sum(p.numel() for p in model.parameters()) / 1e9
    embeddings = model.get_input_embeddings().weight.numel() / 1e9
    want_total, want_body = PUBLISHED[name]
    assert total == pytest.approx(want_total, abs=0.05)
    assert total - embeddings * (1 if model.config.tie_word_embeddings else 2) == pytest.approx(want_body, abs=0.05)


def test_every_table_entry_builds_and_lookups_copy() -> None:
    assert set(PUBLISHED) <= set(HUB_CONFIGS)
    values = hub_config("Qwen/Qwen3-0.6B")
    assert values is not None and values["vocab_size"] == 151936
    values["vocab_size"] = 1
    assert hub_config("Qwen/Qwen3-0.6B")["vocab_size"] == 151936  # type: ignore[index]
    assert hub_config("nobody/none") is None
    assert transformers_config("Qwen/Qwen3-0.6B", num_hidden_layers=2).num_hidden_layers == 2
