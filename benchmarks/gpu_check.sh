#!/usr/bin/env bash
# The checks a lent GPU machine runs (docs/calibration.md): measure a profile of this GPU, then plan
# the shipped GPT on one device with it and run the plan with --audit, so that the measured step,
# the collectives, the matmul FLOPs and the peak memory sit beside the prediction.
# Usage: benchmarks/gpu_check.sh OUTDIR   (writes OUTDIR/profile.yaml, OUTDIR/plan/, OUTDIR/run/)
set -uo pipefail
out="${1:?usage: benchmarks/gpu_check.sh OUTDIR}"
mkdir -p "$out"
ap() { python3 -m autoplan.cli "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"
ap profile --devices 1 --links-from dgx-h200 --model examples/gpt.py --batch 8 --out "$out/profile.yaml" --timeout "${PROFILE_TIMEOUT_S:-240}" || echo "profile failed: rc $?"
profile="$out/profile.yaml"
[ -f "$profile" ] || profile=dgx-h200
ap plan examples/gpt.py --devices 1 --profile "$profile" --batch 8 --out "$out/plan" || exit 1
ap run examples/gpt.py --plan "$out/plan/plan.json" --steps 10 --audit --out "$out/run" || echo "run failed: rc $?"
ap plan examples/gpt.py --devices 1 --profile dgx-h200 --batch 8 --out "$out/plan-datasheet" &&
  ap run examples/gpt.py --plan "$out/plan-datasheet/plan.json" --steps 10 --audit --out "$out/run-datasheet" ||
  echo "datasheet-profile run failed"
