"""Tables of benchmarks/gpu_check.sh: what each case measured beside its predictions, and the measured
profile's curves beside the datasheet profile's.

    python benchmarks/gpu_check_summary.py pins PLAN.json        the --fix string that pins PLAN's choices
    python benchmarks/gpu_check_summary.py tables OUTDIR DATASHEET

``tables`` writes OUTDIR/summary.csv, one row per case folder (OUTDIR/<case>/): its status, the measured
median step (run/summary.json), the step predicted with the measured profile (the run's plan) and with the
datasheet profile (the same plan's choices pinned, datasheet/plan.json), and their ratios; and
OUTDIR/curves.csv, one row per efficiency curve of OUTDIR/profile.yaml: the saturated rate a * peak it
measured and the datasheet profile's for the same op class and dtype (docs/profile-format.md, "Compute model").
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoplan.profile import load_profile  # noqa: E402

PINNED = (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("mbs", "micro_batch_size"), ("zero", "zero_stage"))
SUMMARY = (
    "case",
    "precision",
    "compile",
    "status",
    "measured_step_s",
    "predicted_step_s",
    "predicted_datasheet_step_s",
    "measured_over_predicted",
    "measured_over_datasheet",
    "peak_memory_bytes",
)


def pins(plan_path: Path) -> str:
    """dp, tp, pp, mbs, zero, recompute and precision of a plan, as one --fix value."""
    plan = json.loads(plan_path.read_text())
    fixes = [f"{key}={plan[field]}" for key, field in PINNED]
    fixes += [f"recompute={plan['recompute']}", f"precision={plan['precision']}"]
    return ",".join(fixes)


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 4) if top and bottom else None


def case_row(case: Path) -> dict:
    """One case folder's row (empty cells where a step did not run)."""
    run, plan = _json(case / "run" / "summary.json"), _json(case / "plan" / "plan.json")
    datasheet = _json(case / "datasheet" / "plan.json")
    status = (case / "status.txt").read_text().strip() if (case / "status.txt").is_file() else "unknown"
    measured = run.get("median_step_time_s")
    predicted = run.get("predicted_step_time_s") or (plan.get("predicted") or {}).get("step_time_s")
    on_datasheet = (datasheet.get("predicted") or {}).get("step_time_s")
    name = case.name
    return {
        "case": name,
        "precision": plan.get("precision", "fp8" if "-fp8" in name else "bf16"),
        "compile": "compile" in name,
        "status": status,
        "measured_step_s": measured,
        "predicted_step_s": predicted,
        "predicted_datasheet_step_s": on_datasheet,
        "measured_over_predicted": _ratio(measured, predicted),
        "measured_over_datasheet": _ratio(measured, on_datasheet),
        "peak_memory_bytes": run.get("peak_memory_bytes"),
    }


def curve_rows(profile_path: Path, datasheet: str) -> list[dict]:
    """Each measured curve (joint and per dtype) beside the datasheet profile's saturated rate."""
    measured, sheet = load_profile(profile_path).device, load_profile(datasheet).device
    curves = [("any", op, eff) for op, eff in measured.efficiency.items()]
    curves += [(dtype, op, eff) for dtype, by in measured.efficiency_by_dtype.items() for op, eff in by.items()]
    rows = []
    for dtype, op, eff in curves:
        peak_dtype = dtype if dtype in measured.peak_flops else max(measured.peak_flops, key=measured.peak_flops.get)
        rate = eff.max_efficiency * measured.peak_flops[peak_dtype]
        sheet_rate = (
            sheet.efficiency_for(op, peak_dtype).max_efficiency * sheet.peak_flops[peak_dtype]
            if peak_dtype in sheet.peak_flops
            else None
        )
        rows.append(
            {
                "op_class": op,
                "dtype": dtype,
                "max_efficiency": round(eff.max_efficiency, 4),
                "half_saturation_flops": f"{eff.half_saturation_flops:.4g}",
                "saturated_tflops": round(rate / 1e12, 3),
                "datasheet_saturated_tflops": round(sheet_rate / 1e12, 3) if sheet_rate else None,
                "measured_over_datasheet": _ratio(rate, sheet_rate),
            }
        )
    return rows


def _write(path: Path, rows: list[dict], fields: tuple[str, ...] | list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)


def tables(out: Path, datasheet: str) -> None:
    rows = [case_row(case) for case in sorted(p.parent for p in out.glob("*/status.txt"))]
    _write(out / "summary.csv", rows, SUMMARY)
    for row in rows:
        print(", ".join(f"{key}={value}" for key, value in row.items()))
    if (out / "profile.yaml").is_file():
        curves = curve_rows(out / "profile.yaml", datasheet)
        _write(out / "curves.csv", curves, list(curves[0]) if curves else ["op_class"])


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "pins":
        print(pins(Path(argv[1])))
        return 0
    if len(argv) == 3 and argv[0] == "tables":
        tables(Path(argv[1]), argv[2])
        return 0
    print("usage: gpu_check_summary.py pins PLAN.json | tables OUTDIR DATASHEET", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
