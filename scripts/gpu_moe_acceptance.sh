#!/usr/bin/env bash
# GPU acceptance of RL with LoRA on an MoE model's experts (docs/moe.md), under 3 minutes on one H200:
# a small random Qwen3-MoE (lorarl.tiny_model --num-experts 8: 63M parameters, 4 layers, hidden 1024,
# head_dim 128, 8 experts of width 512, top-2) runs a few on-policy bfloat16 `rl` steps with LoRA
# rank 8 on attention and every expert, through vLLM started with --enable-mixed-moe-lora-format and --max-lora-rank 16
# (PEFT's fused gate_up_proj has rank 2r), each version loaded with is_3d_lora_weight. It prints the
# placement and memory plan, then per step the trainer-vLLM logprob gap (mismatch/logprob_abs_diff:
# at max_async_level 0 the rollouts are on-policy, so it is the serving error of the expert LoRA alone),
# the step times and the hand-off latency, then peak memory against the plan: scripts/gpu_acceptance.sh
# with MODELS=moe, which takes the same variables (STEPS, MAX_TOKENS, PY, OUT_DIR, PORT, RUN_TIMEOUT).
#
#   bash scripts/gpu_moe_acceptance.sh             # on a GPU machine with the GPU build of vLLM
#   bash scripts/gpu_moe_acceptance.sh --dry-run   # anywhere: builds the model (seconds), plans one GPU
set -euo pipefail
MODELS=moe exec bash "$(dirname "$0")/gpu_acceptance.sh" "$@"
