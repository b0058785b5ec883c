"""The model builder: published shapes (on the meta device, and small real builds) with the local
tokenizer, a vocabulary larger than the tokenizer's, and the CLI's checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from lorarl import model_shapes
from lorarl.tiny_model import build_tokenizer, save_shaped_model, save_tiny_model, shape_config


@pytest.mark.parametrize("shape", ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"])
def test_a_shape_keeps_the_published_config_but_the_special_tokens(shape: str) -> None:
    tok = build_tokenizer()
    config = shape_config(shape, tok.eos_token_id, tok.pad_token_id)
    published = model_shapes.hub_config(shape)
    assert published is not None
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "tie_word_embeddings",
    ):
        assert getattr(config, key) == published[key], key
    assert config.vocab_size == 151936 > len(tok)
    assert (config.eos_token_id, config.pad_token_id, config.bos_token_id) == (tok.eos_token_id, tok.pad_token_id, None)
    with torch.device("meta"):
        full = AutoModelForCausalLM.from_config(config)
        two = AutoModelForCausalLM.from_config(shape_config(shape, tok.eos_token_id, tok.pad_token_id, num_layers=2))
    assert len(two.model.layers) == 2 < len(full.model.layers) == published["num_hidden_layers"]


@pytest.fixture
def small_shape(monkeypatch: pytest.MonkeyPatch) -> str:
    """Qwen3-0.6B's config narrowed to a size a unit test can build: the same code path as a real shape."""
    values = {
        **model_shapes.HUB_CONFIGS["Qwen/Qwen3-0.6B"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "vocab_size": 1024,
    }
    monkeypatch.setitem(model_shapes.HUB_CONFIGS, "test/small-qwen3", values)
    return "test/small-qwen3"


def test_a_shaped_model_in_bfloat16_loads_in_transformers_and_peft(small_shape: str, tmp_path: Path) -> None:
    out = save_shaped_model(tmp_path / "m", small_shape, torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    assert model.get_input_embeddings().weight.shape == (1024, 64)
    assert len(tok) == 259 and model.generation_config.eos_token_id == tok.eos_token_id
    peft = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    ids = torch.tensor([tok.encode("hello")])
    logits = peft(input_ids=ids).logits
    assert logits.shape == (1, 5, 1024) and torch.isfinite(logits).all()


def test_a_custom_vocabulary_and_the_default_one(tmp_path: Path) -> None:
    wide = save_tiny_model(tmp_path / "wide", hidden_size=64, num_layers=1, vocab_size=1000)
    plain = save_tiny_model(tmp_path / "plain", hidden_size=64, num_layers=1)
    assert AutoModelForCausalLM.from_pretrained(wide).config.vocab_size == 1000
    assert AutoModelForCausalLM.from_pretrained(plain).config.vocab_size == 259


@pytest.mark.slow
def test_the_cli_refuses_a_dtype_without_a_shape(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lorarl.tiny_model", str(tmp_path / "m"), "--dtype", "bfloat16"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2 and "--dtype and --config-only are for --shape models" in out.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_the_cli_refuses_a_custom_width_with_a_shape(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "lorarl.tiny_model",
        str(tmp_path / "m"),
        "--shape",
        "Qwen/Qwen3-0.6B",
        "--vocab-size",
        "9",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "--shape fixes them" in out.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_config_only_shape_has_no_weights_but_its_full_size(tmp_path: Path) -> None:
    out = tmp_path / "m"
    cmd = [
        sys.executable,
        "-m",
        "lorarl.tiny_model",
        str(out),
        "--shape",
        "Qwen/Qwen3-4B",
        "--dtype",
        "bfloat16",
        "--config-only",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "4022.47M parameters, config only" in result.stdout
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert not list(out.glob("*.safetensors"))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
