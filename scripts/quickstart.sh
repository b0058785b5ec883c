#!/usr/bin/env bash
# The CPU quickstart: set up (if needed), build the tiny local model and warm-up data, run a short
# supervised warm-up (`sft`), then LoRA RL through a real vLLM server (`rl`). Runs land in outputs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 WANDB_MODE=${WANDB_MODE:-disabled} TOKENIZERS_PARALLELISM=false
PY=.venv/bin/python

[[ -f outputs/models/tiny-qwen3/config.json ]] || $PY -m lorarl.tiny_model outputs/models/tiny-qwen3
[[ -f outputs/data/reverse_text_sft.jsonl ]] ||
    $PY scripts/make_sft_data.py --env reverse_text --num 4000 --out outputs/data/reverse_text_sft.jsonl

echo "== sft: supervised warm-up (configs/quickstart/sft.toml)"
.venv/bin/sft @ configs/quickstart/sft.toml --overwrite   # the quickstart may run again: start over
echo "== rl: LoRA RL through vLLM (configs/quickstart/rl.toml)"
.venv/bin/rl @ configs/quickstart/rl.toml --overwrite
$PY scripts/summarize_run.py outputs/quickstart-rl
echo "== plots (lorarl-plot): the overview, then one PNG per panel"
.venv/bin/lorarl-plot outputs/quickstart-rl
