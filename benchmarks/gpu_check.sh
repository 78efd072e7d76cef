#!/usr/bin/env bash
# The checks a lent GPU machine runs: measure a profile of this GPU (one device, links copied from
# the datasheet profile dgx-h200), then plan two GPTs on one device with it and with the datasheet
# profile, and run each plan with --audit, so that the measured step, the matmul FLOPs and the peak
# memory sit beside the prediction. The small GPT (4 x 512) is launch-bound on a GPU; the large one
# (12 x 2048, 2K tokens) is compute-bound.
# Usage: benchmarks/gpu_check.sh OUTDIR   (writes OUTDIR/profile.yaml, OUTDIR/<case>/{plan,run}, OUTDIR/summary.csv)
set -uo pipefail
out="${1:?usage: benchmarks/gpu_check.sh OUTDIR}"
mkdir -p "$out"
ap() { python3 -m autoplan.cli "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"
ap profile --devices 1 --links-from dgx-h200 --model examples/gpt.py --batch 8 --out "$out/profile.yaml" \
  --timeout "${PROFILE_TIMEOUT_S:-300}" || echo "profile failed: rc $?"

check() {  # check NAME PROFILE BATCH [ENV...]: plan on one device with PROFILE, run it with --audit
  local name=$1 profile=$2 batch=$3
  shift 3
  # bf16: torchao (FP8) is built for the CPU torch here, not for the GPU machine's torch
  env "$@" python3 -m autoplan.cli plan examples/gpt.py --devices 1 --profile "$profile" --batch "$batch" \
    --fix precision=bf16 --out "$out/$name/plan" &&
    env "$@" python3 -m autoplan.cli run examples/gpt.py --plan "$out/$name/plan/plan.json" --steps 10 --audit \
      --out "$out/$name/run" || echo "$name failed"
}
large=(AUTOPLAN_GPT_N_LAYER=12 AUTOPLAN_GPT_N_EMBD=2048 AUTOPLAN_GPT_N_HEAD=16 AUTOPLAN_GPT_BLOCK_SIZE=2048)
[ -f "$out/profile.yaml" ] && check small-measured "$out/profile.yaml" 8
check small-datasheet dgx-h200 8
[ -f "$out/profile.yaml" ] && check large-measured "$out/profile.yaml" 8 "${large[@]}"
check large-datasheet dgx-h200 8 "${large[@]}"

python3 - "$out" <<'PY'
import csv, json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = []
for summary in sorted(out.glob("*/run/summary.json")):
    s, plan = json.loads(summary.read_text()), json.loads((summary.parent.parent / "plan" / "plan.json").read_text())
    rows.append({"case": summary.parent.parent.name, "plan": plan.get("label") or plan.get("precision"),
                 "measured_step_s": s["median_step_time_s"], "predicted_step_s": s["predicted_step_time_s"],
                 "measured_over_predicted": s["measured_over_predicted"], "peak_memory_bytes": s["peak_memory_bytes"]})
with open(out / "summary.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["case"])
    w.writeheader(); w.writerows(rows)
for r in rows:
    print(r)
PY
