from pathlib import Path

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lorarl.cli.merge import main
from lorarl.tiny_model import save_tiny_model


@pytest.fixture
def base_and_adapter(tmp_path: Path) -> tuple[Path, Path]:
    base = save_tiny_model(tmp_path / "base", hidden_size=64, num_layers=2)
    # A random B (PEFT starts it at zero), so that the adapter really changes the model.
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    torch.manual_seed(1)
    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
    model.save_pretrained(tmp_path / "adapter")
    return base, tmp_path / "adapter"


def test_merged_model_has_the_logits_of_base_plus_adapter(base_and_adapter: tuple[Path, Path], tmp_path: Path) -> None:
    base, adapter = base_and_adapter
    main(["--base", str(base), "--adapter", str(adapter), "--out", str(tmp_path / "merged")])

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not isinstance(merged, peft.PeftModel) and merged.dtype == torch.float32
    with_adapter = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter))
    plain = AutoModelForCausalLM.from_pretrained(base)
    ids = AutoTokenizer.from_pretrained(tmp_path / "merged")("reverse me: stone river", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = with_adapter(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-2)  # the adapter mattered


def test_merge_writes_the_dtype_asked_for(base_and_adapter: tuple[Path, Path], tmp_path: Path) -> None:
    base, adapter = base_and_adapter
    main(["--base", str(base), "--adapter", str(adapter), "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16"])
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype="auto").dtype == torch.bfloat16


def test_merge_names_a_folder_that_is_no_adapter(
    base_and_adapter: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = base_and_adapter
    with pytest.raises(SystemExit) as exit_info:
        main(["--base", str(base), "--adapter", str(base), "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    assert f"{base}: not a PEFT adapter folder" in capsys.readouterr().err
