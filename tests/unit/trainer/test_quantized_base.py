"""model.quantization = "nf4" on the CPU with real bitsandbytes, transformers and PEFT: the trainer's
4-bit base, the copy vLLM serves (bit for bit what the trainer computes with), the merge into the
full-precision base, and bad input in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("bitsandbytes")

from lorarl.config.model import LoraConfig, ModelConfig  # noqa: E402
from lorarl.quantized_base import BASE_NOTE, check_quantization, held_bytes, write_served_base  # noqa: E402
from lorarl.trainer.model import apply_lora, load_model, save_adapter  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def effective_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What each 4-bit layer of the trainer multiplies with, read off its output on the identity
    (x = I gives W^T exactly: every sum adds zeros) and, for the embeddings, on every token."""
    from bitsandbytes.nn import Embedding4bit, Linear4bit

    found = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, Linear4bit):
                found[f"{name}.weight"] = module(torch.eye(module.in_features)).T.contiguous()
            elif isinstance(module, Embedding4bit):
                found[f"{name}.weight"] = module(torch.arange(module.num_embeddings))
    return found


@pytest.fixture(scope="module")
def nf4(tiny_model: Path) -> ModelConfig:
    return ModelConfig(name=str(tiny_model), quantization="nf4", lora=LoraConfig(rank=4))


def test_quantized_load_holds_a_quarter_of_the_base_and_computes_as_the_served_copy(
    nf4: ModelConfig, tmp_path: Path
) -> None:
    from bitsandbytes.nn import Embedding4bit, Linear4bit
    from transformers import AutoModelForCausalLM

    model = load_model(nf4)
    full = load_model(nf4.model_copy(update={"quantization": "none"}))
    linear = [n for n, m in full.named_modules() if isinstance(m, torch.nn.Linear)]
    assert linear and all(isinstance(model.get_submodule(n), Linear4bit) for n in linear)
    assert isinstance(model.get_input_embeddings(), Embedding4bit)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied
    assert held_bytes(model) <= 0.35 * held_bytes(full) / 2  # float32 base: <= 0.35x of bfloat16's

    (tmp_path / "served").mkdir()
    write_served_base(nf4, tmp_path / "served")
    served = AutoModelForCausalLM.from_pretrained(tmp_path / "served", dtype=torch.float32)
    ids = torch.tensor([[5, 17, 42, 99, 7, 3, 250]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, served(ids).logits)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_the_quantized_base_keeps_no_view_of_the_checkpoint_file(nf4: ModelConfig, tmp_path: Path) -> None:
    """The weights left in full precision are copied off the mapped file, or its every page read while
    quantizing stays resident (2.2 GiB at Qwen3-0.6B's shape in float32, docs/qlora.md)."""
    import gc
    import shutil

    folder = shutil.copytree(nf4.name, tmp_path / "model")  # a file no other test maps
    model = load_model(nf4.model_copy(update={"name": str(folder)}))
    gc.collect()
    assert str(folder / "model.safetensors") not in Path("/proc/self/maps").read_text()
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert norms and all(p.dtype == torch.float32 for p in norms)  # copied as they were, in model.dtype


def test_served_base_is_the_trainers_weights_bit_for_bit(nf4: ModelConfig, tmp_path: Path) -> None:
    model = load_model(nf4)
    write_served_base(nf4, tmp_path)
    served = load_file(tmp_path / "model.safetensors")
    trainer = effective_weights(model)
    assert "model.embed_tokens.weight" in trainer and "lm_head.weight" in trainer
    assert torch.equal(trainer.pop("lm_head.weight"), served["model.embed_tokens.weight"])  # tied: served once
    for name, weight in trainer.items():
        assert torch.equal(weight, served[name]), name
    for name, p in model.named_parameters():  # the rest (norms) as loaded
        if getattr(p, "quant_state", None) is None:
            assert torch.equal(p, served[name]), name
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is True
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())


@pytest.mark.slow
def test_adapter_on_a_quantized_base_trains_and_merges_into_the_full_precision_base(
    nf4: ModelConfig, tiny_model: Path, tmp_path: Path
) -> None:
    import peft
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = apply_lora(load_model(nf4), nf4.lora)  # type: ignore[arg-type]
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    model(ids, labels=ids).loss.backward()
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)
    with torch.no_grad():
        for p in lora_b:
            p.add_(0.01)
    save_adapter(model, tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / BASE_NOTE).read_text())["quantization"] == "nf4"

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    out = tmp_path / "merged"
    done = subprocess.run(
        [sys.executable, "-m", "lorarl.cli.merge", "--base", str(tiny_model), "--adapter", str(tmp_path / "adapter"),
         "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "4-bit" in line]
    assert len(said) == 1 and "merged into the full-precision base" in said[0]
    # The merge is base + adapter on the full-precision weights, not on the 4-bit ones.
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    expected = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).merge_and_unload()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    pairs = zip(expected.state_dict().values(), merged.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_device_bitsandbytes_cannot_use_is_one_line(nf4: ModelConfig) -> None:
    with pytest.raises(ValueError) as e:
        check_quantization(nf4, torch.device("cuda"))
    assert "model.quantization = 'nf4'" in str(e.value) and "\n" not in str(e.value)


def cli_error(command: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", f"lorarl.cli.{command}", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("command", "args", "said"),
    [
        ("rl", ["--model.quantization", "int4"], "model.quantization"),
        ("rl", ["--model.quantization", "nf4", "--model.full_finetune"], "full_finetune"),
        ("sft", ["--model.quantization", "nf4", "--data.path", "x.jsonl"], "[model.lora]"),
    ],
)
@pytest.mark.slow
def test_bad_quantization_is_one_line(tiny_model: Path, command: str, args: list[str], said: str) -> None:
    assert said in cli_error(command, "--model.name", str(tiny_model), *args, "--dry-run")


@pytest.mark.slow
def test_rl_serves_the_run_folders_copy_under_the_model_name(tiny_model: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    args = ["--model.name", str(tiny_model), "--model.quantization", "nf4", "--output_dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "lorarl.cli.rl", "@", str(REPO / "configs/quickstart/rl.toml"), *args, "--dry-run"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    served = tmp_path / "quickstart-rl" / "served_base"
    worker = next(line for line in done.stdout.splitlines() if "vllm.entrypoints" in line)
    assert f"--model {served} --served-model-name {tiny_model} --tokenizer {tiny_model}" in worker
    assert not served.exists()  # a dry run writes nothing but configs/


def test_the_served_base_is_written_once_and_recorded(nf4: ModelConfig, tmp_path: Path) -> None:
    from lorarl.quantized_base import ensure_served_base
    from lorarl.run_folder import RunFolder
    from lorarl.written_files import recorded

    run = RunFolder(tmp_path / "run")
    run.prepare("rl", {}, resume=False, overwrite=False)
    folder = ensure_served_base(nf4, run.root)
    assert "served_base/" in recorded(run.root) and (folder / "MANIFEST.json").is_file()
    written = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_served_base(nf4, run.root) == folder  # a resumed run's: kept as it is
    assert (folder / "model.safetensors").stat().st_mtime_ns == written
