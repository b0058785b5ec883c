#!/usr/bin/env bash
# GPU acceptance at real shapes, about 2 minutes a model on one H200: random-weight models of Qwen3-0.6B's
# and Qwen3-4B's exact configs (vocabulary 151,936; built here by lorarl.tiny_model --shape, no hub
# needed) each run a few bfloat16 `rl` steps through vLLM and the trainer, on-policy
# (max_async_level 0), with completions of MAX_TOKENS tokens (random weights never stop early).
# For each model it prints the placement and memory plan first (`rl --dry-run`), then per step the
# step time and tokens/s of the trainer and the orchestrator, the trainer-vLLM logprob gap
# (mismatch/logprob_abs_diff), the hand-off latency (perf/adapter_live_s) and the trainer's peak
# memory, then each process's peak memory (nvidia-smi, polled every second) against the plan
# (scripts/gpu_acceptance_report.py). The 0.6B runs LoRA rank 8, the 4B rank 64 on the 7
# projections (a 132M-parameter adapter to write, load and checkpoint every step). MODELS=moe (what
# scripts/gpu_moe_acceptance.sh runs) is a small random Qwen3-MoE (4 layers of 8 experts, top-2) with LoRA
# on attention and every expert, served by vLLM in PEFT's fused layout (docs/moe.md). 0.6B-nf4 is the
# 0.6B run on its base in NF4 (model.quantization, docs/qlora.md): its logprob gap against the 0.6B's.
#
#   bash scripts/gpu_acceptance.sh             # 2+ GPUs: vLLM on GPU 0, the trainer on GPU 1
#                                              # 1 GPU: both on GPU 0 (inference.colocate_with_trainer)
#   bash scripts/gpu_acceptance.sh --dry-run   # anywhere, no GPU: each run's placement and memory plan
#                                              # on one pretended GPU, the shapes named by hub id
#   MODELS="0.6B" STEPS=3 MAX_TOKENS=1024 PY=/path/to/python OUT_DIR=/tmp/acc PORT=8200 bash scripts/gpu_acceptance.sh
#
# Needs the GPU build (`scripts/setup.sh` on a GPU machine installs `vllm`) and nvidia-smi.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT_DIR=${OUT_DIR:-outputs/gpu-acceptance}
MODELS=${MODELS:-0.6B 0.6B-nf4 4B}
STEPS=${STEPS:-3}
MAX_TOKENS=${MAX_TOKENS:-1024}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}  # seconds per model: vLLM's start (~1 min eager) and STEPS steps
DRY_RUN_GPU_GIB=${DRY_RUN_GPU_GIB:-139}  # --dry-run pretends one GPU of this size (an H200)
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

dry_run=false
case ${1:-} in
    --dry-run) dry_run=true ;;
    "") ;;
    *) echo "usage: bash scripts/gpu_acceptance.sh [--dry-run]" >&2; exit 2 ;;
esac

if $dry_run; then
    gpus=1
    pretend=(--dry-run-devices 1 --device_memory_gib "$DRY_RUN_GPU_GIB")
else
    gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    if [[ $gpus -lt 1 ]]; then
        echo "gpu_acceptance: no GPU visible to torch; run it on a GPU machine, or with --dry-run" >&2
        exit 1
    fi
    command -v nvidia-smi >/dev/null || { echo "gpu_acceptance: nvidia-smi not found" >&2; exit 1; }
    pretend=()
fi

# name, hub shape (or "moe": lorarl.tiny_model's MoE), LoRA rank, micro-batch size (16 rollouts a step,
# 4 x 4), model.quantization
shape_of() {
    case $1 in
        0.6B) echo "Qwen/Qwen3-0.6B 8 16 none" ;;
        0.6B-nf4) echo "Qwen/Qwen3-0.6B 8 16 nf4" ;;
        4B) echo "Qwen/Qwen3-4B 64 4 none" ;;
        moe) echo "moe 8 16 none" ;;
        *) echo "gpu_acceptance: unknown model $1 in MODELS (0.6B, 0.6B-nf4, 4B, moe)" >&2; return 1 ;;
    esac
}

# The model of $1 (hub shape $2): its bfloat16 random-weight folder; for a dry run the hub id itself,
# whose shape lorarl's memory plan knows without the hub (a start's checks refuse a folder without
# weights, and the 4B's would be 8 GB to build just for a plan). The MoE has no hub id: it is built
# (63M parameters, seconds of CPU) for a dry run too.
model_of() {
    if $dry_run && [[ $2 != moe ]]; then echo "$2"; else echo "$OUT_DIR/models/${1%-nf4}"; fi
}

# Build model $1 of hub shape $2 unless its folder has it; the log in the folder's parent.
build_model() {
    local folder=$OUT_DIR/models/${1%-nf4} shape=(--shape "$2" --dtype bfloat16)
    # vLLM's GPU attention and MoE kernels take head_dim 128; float32 weights, run in bfloat16.
    [[ $2 != moe ]] || shape=(--hidden-size 1024 --head-dim 128 --num-layers 4 --num-experts 8)
    compgen -G "$folder/*.safetensors" >/dev/null ||
        "$PY" -m lorarl.tiny_model "$folder" "${shape[@]}" > "$folder.build.log" 2>&1
}

# The `rl` flags of one model's run.
rl_flags() {
    local name=$1 folder=$2 rank=$3 micro=$4 quantization=$5
    flags=(@ configs/quickstart/rl.toml --model.name "$folder" --model.dtype bfloat16
           --model.quantization "$quantization"
           --model.lora.rank "$rank" --model.lora.alpha "$((2 * rank))"
           --max_steps "$STEPS" --seq_len "$((MAX_TOKENS + 128))"
           --orchestrator.sampling.max_tokens "$MAX_TOKENS" --orchestrator.batch_size 16
           --orchestrator.rollouts_per_example 4 --orchestrator.max_async_level 0
           --trainer.micro_batch_size "$micro" --trainer.ckpt.interval 1
           --output_dir "$OUT_DIR" --run_name "qwen3-$name" --overwrite
           "--inference.extra_args=--enforce-eager")  # eager: no CUDA graph capture at start
    [[ -z ${PORT:-} ]] || flags+=(--inference.port "$PORT")  # another than the quickstart's
    if [[ $gpus -eq 1 ]]; then
        # vLLM takes 0.3 of the GPU (the 4B's weights and a KV cache of ~200 sequences), the trainer the rest.
        flags+=(--inference.colocate_with_trainer --inference.gpu_memory_utilization 0.3)
    fi
}

# Poll nvidia-smi into $1 until killed: per process (pid, MiB, command) and per GPU (index, MiB used).
poll_gpu_memory() {
    while :; do
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
            while IFS=', ' read -r pid mem; do
                cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-160 || true)
                echo "proc $pid $mem ${cmd:-?}"
            done
        nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits 2>/dev/null |
            while IFS=', ' read -r index mem; do echo "gpu $index $mem"; done
        sleep 1
    done >> "$1"
}

poller=
trap '[[ -z $poller ]] || kill "$poller" 2>/dev/null || true' EXIT
mkdir -p "$OUT_DIR/models"
# Every model is built at once in the background (the 4B's 8 GB of random weights take about a
# minute of CPU), each run waiting for its own.
declare -A builds
for name in $MODELS; do
    read -r shape _ _ _ < <(shape_of "$name") || exit 2
    [[ $(model_of "$name" "$shape") == "$shape" ]] && continue  # a dry run's hub id: nothing to build
    [[ -z ${builds[${name%-nf4}]:-} ]] || continue  # 0.6B-nf4 runs on the 0.6B's folder
    build_model "$name" "$shape" &
    builds[${name%-nf4}]=$!
done
failed=0
for name in $MODELS; do
    read -r shape rank micro quantization < <(shape_of "$name")
    folder=$(model_of "$name" "$shape")
    [[ -z ${builds[${name%-nf4}]:-} ]] || wait "${builds[${name%-nf4}]}" || { echo "gpu_acceptance: building $folder failed: $folder.build.log" >&2; exit 1; }
    echo "== qwen3-$name ($shape shape, random weights, $folder): placement and memory plan"
    rl_flags "$name" "$folder" "$rank" "$micro" "$quantization"
    # A hub id passes the checks only where a hub may be reached (none is asked: the shape is lorarl's).
    HF_HUB_OFFLINE=$($dry_run && echo 0 || echo 1) "$PY" -m lorarl.cli.rl "${flags[@]}" --dry-run "${pretend[@]}" | sed '/^# /,$d'
    $dry_run && continue

    smi_log=$OUT_DIR/nvidia-smi-$name.log
    : > "$smi_log"
    poll_gpu_memory "$smi_log" &
    poller=$!
    echo "== qwen3-$name: rl, $STEPS steps of 16 completions of $MAX_TOKENS tokens (logs in $OUT_DIR/qwen3-$name/logs/)"
    start=$(date +%s)
    status=0
    timeout "$RUN_TIMEOUT" "$PY" -m lorarl.cli.rl "${flags[@]}" || status=$?
    echo "rl exited with $status after $(( $(date +%s) - start )) s"
    kill "$poller" 2>/dev/null || true
    poller=
    "$PY" scripts/gpu_acceptance_report.py "$OUT_DIR/qwen3-$name" "$smi_log" --steps "$STEPS" || status=1
    [[ $status -eq 0 ]] || failed=1
done
$dry_run && echo "gpu_acceptance: dry run, nothing started (the plans above are for one GPU of $DRY_RUN_GPU_GIB GiB)"
exit "$failed"
