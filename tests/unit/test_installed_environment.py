"""The environment scripts/setup.sh builds: transformers model classes and vLLM both import, and
lorarl-plot runs, and the console scripts carry their names."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_transformers_qwen3_and_vllm_import_together() -> None:
    # A fresh interpreter: import order and side effects as in a real `rl` process.
    code = "from transformers import Qwen3ForCausalLM; import vllm, peft; print(vllm.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("0.32.0")


def test_cuda_linked_vision_and_audio_packages_are_left_out() -> None:
    import torch

    if torch.cuda.is_available():  # GPU installs keep the CUDA builds vLLM expects
        return
    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed; it breaks transformers on CPU torch"


@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_lorarl_plot_console_script(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "component": "sft", "loss": 2.0}\n')
    script = Path(sys.executable).parent / "lorarl-plot"
    out = subprocess.run([str(script), str(run)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [str(run / "plots" / "overview.png"), str(run / "plots" / "sft_loss.png")]


@pytest.mark.slow
def test_console_scripts_are_rl_sft_and_lorarl_prefixed() -> None:
    """Generic names (merge, trainer, orchestrator, inference) would collide with other tools on a
    user's PATH: every command but rl and sft carries the lorarl- prefix, and the old names are gone."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    names = set(pyproject["project"]["scripts"])
    assert names == {"rl", "sft"} | {
        f"lorarl-{n}" for n in ("plot", "merge", "trainer", "orchestrator", "inference", "serve")
    }
    bin_dir = Path(sys.executable).parent
    assert all((bin_dir / n).exists() for n in names)
    assert not [n for n in ("merge", "trainer", "orchestrator", "inference") if (bin_dir / n).exists()]
    out = subprocess.run([str(bin_dir / "lorarl-merge"), "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("usage: lorarl-merge"), out.stderr[-3000:]
