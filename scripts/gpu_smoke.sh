#!/usr/bin/env bash
# GPU smoke test, under 5 minutes: the tiny local model through vLLM and the trainer on GPU for 3
# steps in bfloat16, on-policy (max_async_level 0). Prints each step's time, the trainer-vLLM
# logprob gap (mismatch/logprob_abs_diff) and the peak GPU memory of each process: the trainer's
# memory/peak_gib (torch's most allocated) and, from nvidia-smi polled every second, what each
# process and each GPU held at most (CUDA context and vLLM's KV cache included).
#
#   bash scripts/gpu_smoke.sh     # 2+ GPUs: vLLM on GPU 0, the trainer on GPU 1 (the default placement)
#                                 # 1 GPU: both on GPU 0 (inference.colocate_with_trainer)
#   PY=/path/to/python OUT_DIR=/tmp/smoke bash scripts/gpu_smoke.sh
#
# Needs the GPU build (`scripts/setup.sh` on a GPU machine installs `vllm`) and nvidia-smi.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT_DIR=${OUT_DIR:-outputs/gpu-smoke}
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [[ $gpus -lt 1 ]]; then
    echo "gpu_smoke: no GPU visible to torch; this test needs one" >&2
    exit 1
fi
command -v nvidia-smi >/dev/null || { echo "gpu_smoke: nvidia-smi not found" >&2; exit 1; }

mkdir -p "$OUT_DIR"
model=$OUT_DIR/tiny-qwen3
[[ -f $model/config.json ]] || "$PY" -m lorarl.tiny_model "$model"

placement=()
if [[ $gpus -eq 1 ]]; then
    # The tiny model needs little: 0.3 of the GPU is ample for vLLM, the rest is the trainer's.
    placement=(--inference.colocate_with_trainer --inference.gpu_memory_utilization 0.3)
fi
flags=(@ configs/quickstart/rl.toml --model.name "$model" --model.dtype bfloat16
       --max_steps 3 --output_dir "$OUT_DIR" --run_name run --overwrite
       --orchestrator.max_async_level 0 --orchestrator.batch_size 64 --trainer.micro_batch_size 64
       "--inference.extra_args=--enforce-eager" "${placement[@]}")  # eager: no CUDA graph capture at start

echo "== placement ($gpus GPU(s) visible)"
"$PY" -m lorarl.cli.rl "${flags[@]}" --dry-run | sed -n '1,/^$/p'

# Poll nvidia-smi: per process (pid, MiB, command) and per GPU (index, MiB used).
smi_log=$OUT_DIR/nvidia-smi.log
: > "$smi_log"
(
    while :; do
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
            while IFS=', ' read -r pid mem; do
                cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-160 || true)
                echo "proc $pid $mem ${cmd:-?}"
            done
        nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits 2>/dev/null |
            while IFS=', ' read -r index mem; do echo "gpu $index $mem"; done
        sleep 1
    done >> "$smi_log"
) &
poller=$!
trap 'kill "$poller" 2>/dev/null || true' EXIT

echo "== rl: 3 steps (logs in $OUT_DIR/run/logs/)"
start=$(date +%s)
status=0
timeout 280 "$PY" -m lorarl.cli.rl "${flags[@]}" || status=$?
echo "rl exited with $status after $(( $(date +%s) - start )) s"
kill "$poller" 2>/dev/null || true

"$PY" - "$OUT_DIR/run/metrics.jsonl" "$smi_log" <<'EOF'
import json
import sys
from collections import defaultdict
from pathlib import Path

metrics, smi = Path(sys.argv[1]), Path(sys.argv[2])
rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
trainer = sorted((r for r in rows if r["component"] == "trainer"), key=lambda r: r["step"])
orch = {r["step"]: r for r in rows if r["component"] == "orchestrator"}
print("== per step (trainer)")
print(f"{'step':>4}  {'trainer s':>9}  {'orch s':>7}  {'|logprob gap|':>13}  {'trainer peak GiB':>16}  {'reward':>6}")
for r in trainer:
    o = orch.get(r["step"], {})
    print(f"{r['step']:>4}  {r['time/step']:>9.2f}  {o.get('time/step', float('nan')):>7.2f}  "
          f"{r['mismatch/logprob_abs_diff']:>13.2e}  {r['memory/peak_gib']:>16.3f}  {o.get('reward/mean', float('nan')):>6.3f}")
procs: dict[str, tuple[int, str]] = {}
per_gpu: dict[str, int] = defaultdict(int)
for line in smi.read_text().splitlines():
    kind, key, mem, *cmd = line.split(" ", 3) + [""]
    if not mem.isdigit():
        continue
    if kind == "proc":
        procs[key] = (max(int(mem), procs.get(key, (0, ""))[0]), cmd[0])
    elif kind == "gpu":
        per_gpu[key] = max(per_gpu[key], int(mem))
print("== peak GPU memory (nvidia-smi, MiB)")
for pid, (mem, cmd) in sorted(procs.items(), key=lambda kv: -kv[1][0]):
    who = "trainer" if "lorarl.cli.trainer" in cmd else "vLLM" if "vllm" in cmd.lower() or cmd == "?" else "other"
    print(f"  {who:<8} pid {pid:>7}  {mem:>7}  {cmd[:90]}")
if not procs:
    print("  (nvidia-smi lists no processes here, e.g. in a container: see the per-GPU peaks)")
for index, mem in sorted(per_gpu.items()):
    print(f"  gpu {index}: {mem} MiB used at most (every process on it)")
if [r["step"] for r in trainer] != [1, 2, 3]:
    sys.exit(f"gpu_smoke: expected trainer steps 1-3 in {metrics}, got {[r['step'] for r in trainer]}")
EOF
exit "$status"
