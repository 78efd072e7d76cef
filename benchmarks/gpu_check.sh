#!/usr/bin/env bash
# The checks a lent GPU machine runs, in at most GPU_CHECK_BUDGET_S (default 480 s) of one H100/H200:
# 1. measure a profile of this GPU (`autoplan profile --devices 1`, links copied from the datasheet profile):
#    GEMMs in fp32/tf32/fp16/bf16 and fp8 (torch._scaled_mm, compute capability >= 8.9), attention forward +
#    backward causal and full at 512..8K tokens, grouped GEMMs (torch._grouped_mm, else bmm), memory bandwidth,
#    and the GPT example's own ops;
# 2. plan the GPT example on one device with that profile (a small 4 x 512 GPT, launch-bound, and a 12 x 2048
#    one at 2K tokens, compute-bound), in bf16 and FP8 (where torchao's float8 imports and the GPU has FP8),
#    each without and with `--fix compile=true` (skipped, and said so, where this autoplan refuses the pin);
#    run each plan with --audit, and price the same choices with the datasheet profile;
# 3. write OUTDIR/summary.csv (measured step beside both predictions) and OUTDIR/curves.csv (the measured
#    curves beside the datasheet's) with benchmarks/gpu_check_summary.py.
# A case that would start past the budget is skipped and recorded as such; the tables are always written.
# GPU_CHECK_DEVICE=cpu runs the same steps on this machine's CPU (GPUs hidden): the quick sweep, a tiny GPT,
# 2 steps, links from cpu-gloo, the small cases only. The test suite runs it that way
# (tests/dist/test_gpu_check_cpu.py). GPU_CHECK_CASES overrides the case list (names as below).
# Usage: benchmarks/gpu_check.sh OUTDIR
#   (writes OUTDIR/profile.yaml, OUTDIR/<case>/{plan,datasheet,run,status.txt}, OUTDIR/summary.csv, curves.csv)
set -uo pipefail
out="${1:?usage: benchmarks/gpu_check.sh OUTDIR}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
device="${GPU_CHECK_DEVICE:-cuda}"
budget_s="${GPU_CHECK_BUDGET_S:-480}"
ap() { python3 -m autoplan.cli "$@"; }
left_s() { echo $((budget_s - SECONDS)); }

if [ "$device" = cpu ]; then
  export CUDA_VISIBLE_DEVICES=""
  datasheet="${GPU_CHECK_LINKS:-cpu-gloo}"
  profile_args=(--quick)
  steps=2
  batch=2
  small=(AUTOPLAN_GPT_N_LAYER=2 AUTOPLAN_GPT_N_EMBD=64 AUTOPLAN_GPT_N_HEAD=2 AUTOPLAN_GPT_BLOCK_SIZE=64
    AUTOPLAN_GPT_VOCAB_SIZE=512)
  large=("${small[@]}")
  cases="${GPU_CHECK_CASES:-small-bf16 small-bf16-compile small-fp8}"
else
  datasheet="${GPU_CHECK_LINKS:-dgx-h200}"
  profile_args=(--model examples/gpt.py --batch 8)
  steps=10
  batch=8
  small=()
  large=(AUTOPLAN_GPT_N_LAYER=12 AUTOPLAN_GPT_N_EMBD=2048 AUTOPLAN_GPT_N_HEAD=16 AUTOPLAN_GPT_BLOCK_SIZE=2048)
  cases="${GPU_CHECK_CASES:-small-bf16 small-bf16-compile large-bf16 large-bf16-compile large-fp8 large-fp8-compile}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
fi
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"

echo "== profile (device $device, links from $datasheet)"
ap profile --devices 1 --links-from "$datasheet" "${profile_args[@]}" --out "$out/profile.yaml" \
  --timeout "${PROFILE_TIMEOUT_S:-240}" || echo "profile failed: rc $?"
profile="$out/profile.yaml"
[ -f "$profile" ] || profile="$datasheet"

fp8_ok() {  # FP8 linears run where torchao's float8 imports and the device has FP8 tensor cores
  python3 -c 'import sys, torch, torchao.float8
sys.exit(0 if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9) else 1)' 2>/dev/null
}

check() {  # check NAME PRECISION COMPILE(0|1) ENV...: plan on one device, price it on the datasheet, run it
  local name=$1 precision=$2 compile=$3 dir="$out/$1"
  shift 3
  mkdir -p "$dir"
  local fix="precision=$precision"
  [ "$compile" = 1 ] && fix="$fix,compile=true"
  if [ "$precision" = fp8 ] && ! fp8_ok; then
    echo "skipped: no FP8 here (torchao.float8 does not import, or no CUDA device of capability >= 8.9)" >"$dir/status.txt"
    return
  fi
  if [ "$(left_s)" -le 30 ]; then
    echo "skipped: the ${budget_s} s budget was spent" >"$dir/status.txt"
    return
  fi
  echo "== $name ($fix), $(left_s) s left"
  env "$@" python3 -m autoplan.cli plan examples/gpt.py --devices 1 --profile "$profile" --batch "$batch" \
    --fix "$fix" --out "$dir/plan" >"$dir/plan.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    local why="plan failed (rc $rc): $(tail -n 1 "$dir/plan.log")"
    [ "$compile" = 1 ] && [ $rc -eq 2 ] && why="skipped: this autoplan refuses the compile pin: $(tail -n 1 "$dir/plan.log")"
    echo "$why" >"$dir/status.txt"
    return
  fi
  local pins
  pins="$(python3 "$here/gpu_check_summary.py" pins "$dir/plan/plan.json")"
  [ "$compile" = 1 ] && pins="$pins,compile=true"
  env "$@" python3 -m autoplan.cli plan examples/gpt.py --devices 1 --profile "$datasheet" --batch "$batch" \
    --fix "$pins" --out "$dir/datasheet" >"$dir/datasheet.log" 2>&1 || echo "datasheet pricing failed"
  local run_s
  run_s=$(left_s)
  [ "$run_s" -lt 30 ] && run_s=30
  env "$@" timeout "$run_s" python3 -m autoplan.cli run examples/gpt.py --plan "$dir/plan/plan.json" \
    --steps "$steps" --audit --out "$dir/run" >"$dir/run.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then echo ok >"$dir/status.txt"; else echo "run failed (rc $rc): $(tail -n 1 "$dir/run.log")" >"$dir/status.txt"; fi
}

for name in $cases; do  # SIZE-PRECISION[-compile]
  IFS=- read -r size precision compiled <<<"$name"
  if [ "$size" = large ]; then sizes=("${large[@]}"); else sizes=("${small[@]}"); fi
  check "$name" "$precision" "$([ "$compiled" = compile ] && echo 1 || echo 0)" "${sizes[@]}"
done

python3 "$here/gpu_check_summary.py" tables "$out" "$datasheet"
echo "gpu_check: ${SECONDS} s of ${budget_s}"
