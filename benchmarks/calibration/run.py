"""Predicted against measured on real runs of this machine, and calibration on held-out plans.

    python -m benchmarks.calibration.run [--quick] [--space quick|default|full] [--steps S] [--models gpt,llama]

1. Trace examples/gpt.py and examples/llama.py at sizes where a step takes 0.2-2 s on this CPU
   (MODELS below, set through the examples' AUTOPLAN_* environment overrides).
2. Enumerate the planner's configurations for 2 processes (plans.py), let the planner fill in
   each pinned one, and add the plan `autoplan plan` chooses.
3. Run each with `autoplan run --steps S` (resumable: a finished run folder is reused unless --fresh).
4. Metrics (report.py): median / max |predicted - measured| / measured, Spearman, chosen plan's
   rank. Targets: median <= 20 %, Spearman >= 0.8, chosen within 10 % of the measured fastest.
   Memory: each run adds `--audit` (one untimed step after the timed ones), whose peak live
   tensor bytes (largest over ranks) stand beside the priced peak; targets: median |error|
   <= 10 %, no plan under-predicted by more than 15 %.
5. Calibrate the profile (autoplan.calibrate) on every other plan ("train") of both models and
   report the error on the rest ("held_out"), which the fit never saw.

Writes benchmarks/results/calibration/{calibration.csv, calibration.png, summary.json,
cpu-gloo-calibrated.yaml} and one run folder per plan. The machine is shared and has 2 cores:
timings are noisy (the spread over a run's steps is in each measured.csv).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoplan.calibrate import FitOptions, calibrate
from autoplan.calibrate.runs import environment
from autoplan.cost.model import CostModel
from autoplan.profile import load_profile, save_profile
from autoplan.trace import trace_model_file
from autoplan.types.cost import Cost
from benchmarks.calibration import plans as P
from benchmarks.calibration import report
from benchmarks.calibration.runs import run_plan, slug

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "calibration"
DEVICES, BATCH = 2, 8
MODELS = {
    "gpt": (
        "examples/gpt.py",
        {
            "AUTOPLAN_GPT_N_LAYER": "4",
            "AUTOPLAN_GPT_N_EMBD": "256",
            "AUTOPLAN_GPT_N_HEAD": "8",
            "AUTOPLAN_GPT_BLOCK_SIZE": "128",
            "AUTOPLAN_GPT_VOCAB_SIZE": "8192",
        },
    ),
    "llama": (
        "examples/llama.py",
        {
            "AUTOPLAN_LLAMA_N_LAYERS": "4",
            "AUTOPLAN_LLAMA_DIM": "256",
            "AUTOPLAN_LLAMA_N_HEADS": "8",
            "AUTOPLAN_LLAMA_N_KV_HEADS": "2",
            "AUTOPLAN_LLAMA_FFN_DIM": "704",
            "AUTOPLAN_LLAMA_SEQ_LEN": "128",
            "AUTOPLAN_LLAMA_VOCAB_SIZE": "8192",
        },
    ),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few plans of one model, 4 steps (development)")
    parser.add_argument(
        "--space", choices=("quick", "default", "full"), default=None, help="which plans (see plans.py)"
    )
    parser.add_argument("--models", default=None, help="comma-separated, from: " + ", ".join(MODELS))
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per run (default 8; 2 warm-up steps are left out of the median)"
    )
    parser.add_argument("--precisions", default="fp32", help="comma-separated precisions to enumerate (default fp32)")
    parser.add_argument("--profile", default="cpu-gloo")
    parser.add_argument("--fresh", action="store_true", help="rerun plans whose run folder already has a result")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="limit per run")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    args.space = args.space or ("quick" if args.quick else "default")
    args.models = (args.models or ("gpt" if args.quick else ",".join(MODELS))).split(",")
    args.steps = args.steps or (4 if args.quick else 8)
    args.precisions = tuple(args.precisions.split(","))
    return args


def model_rows(name: str, args: argparse.Namespace, profile, out: Path) -> tuple[list[dict], object]:
    """Trace, enumerate, plan and run every plan of one model; one row per plan."""
    model_file, env = MODELS[name]
    with environment(tuple(env.items())):
        graph = trace_model_file(str(ROOT / model_file), BATCH)
    configs = P.select(
        P.full_space(graph, profile, devices=DEVICES, batch=BATCH, precisions=args.precisions),
        name=args.space,
        batch=BATCH,
    )
    plans = {
        c.key: p for c in configs if (p := P.make_plan(graph, profile, c, devices=DEVICES, batch=BATCH)) is not None
    }
    chosen = P.chosen_plan(graph, profile, devices=DEVICES, batch=BATCH, precisions=args.precisions)
    plans.setdefault(P.config_key(chosen), chosen)
    rows = []
    for index, (key, plan) in enumerate(sorted(plans.items())):
        print(f"[{name} {index + 1}/{len(plans)}] {plan.describe()}", flush=True)
        done = run_plan(
            model_file=str(ROOT / model_file),
            env=env,
            plan=plan,
            folder=out / name / slug(key),
            steps=args.steps,
            fresh=args.fresh,
            timeout_s=args.timeout_s,
        )
        rows.append(
            _row(name, plan, done, chosen=key == P.config_key(chosen), split="train" if index % 2 == 0 else "held_out")
        )
    return rows, graph


def _row(model: str, plan, done, *, chosen: bool, split: str) -> dict:
    row = {
        "model": model,
        "plan": plan.describe(),
        "split": split,
        "chosen": chosen,
        "measured_s": done.measured_s,
        "predicted_s": plan.predicted.step_time_s,
        "folder": str(done.folder),
        "error": done.error,
        "plan_obj": plan,
        "spread_pct": done.spread_pct,
        "predicted_peak_bytes": done.predicted_peak_bytes,
        "measured_peak_bytes": done.measured_peak_bytes,
        "memory_err_pct": report.signed_pct(done.predicted_peak_bytes, done.measured_peak_bytes),
        "measured_rank": None,
        "calibrated_s": None,
        "calibrated_abs_pct_err": None,
        "abs_pct_err": report.ape(plan.predicted.step_time_s, done.measured_s) if done.measured_s else None,
    }
    row.update({k: plan.predicted.breakdown[k] for k in Cost.TIME_FIELDS})
    return row


def calibrate_on_train(rows: list[dict], graphs: dict, args: argparse.Namespace, out: Path) -> dict:
    train = [r["folder"] for r in rows if r["split"] == "train" and r["measured_s"]]
    result = calibrate(train, profile=args.profile, options=FitOptions())
    save_profile(result.profile, out / f"{args.profile}-calibrated.yaml")
    models = {name: CostModel(graph, result.profile) for name, graph in graphs.items()}
    for row in rows:
        row["calibrated_s"] = models[row["model"]].estimate(row["plan_obj"]).step_time_s
        if row["measured_s"]:
            row["calibrated_abs_pct_err"] = report.ape(row["calibrated_s"], row["measured_s"])
    return result.profile.calibration["parameters"]


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    profile = load_profile(args.profile)
    rows, graphs = [], {}
    for name in args.models:
        model_rows_, graphs[name] = model_rows(name, args, profile, out)
        report.rank(model_rows_)
        rows += model_rows_
    parameters = calibrate_on_train(rows, graphs, args, out)
    summaries = {}
    for name in args.models:
        mine = [r for r in rows if r["model"] == name]
        summaries[f"{name}: all, as measured"] = report.metrics(mine)
        held = [r for r in mine if r["split"] == "held_out"]
        summaries[f"{name}: held-out, as measured"] = report.metrics(held)
        summaries[f"{name}: held-out, calibrated"] = report.metrics(held, predicted="calibrated_s")
        summaries[f"{name}: all, calibrated"] = report.metrics(mine, predicted="calibrated_s")
    report.write_csv(out / "calibration.csv", rows)
    report.plot(out / "calibration.png", rows)
    report.print_table(rows, summaries)
    (out / "summary.json").write_text(
        json.dumps(
            {"summaries": summaries, "calibrated_parameters": parameters, "space": args.space, "steps": args.steps},
            indent=2,
            default=str,
        )
    )
    print(f"wrote {out / 'calibration.csv'}, {out / 'calibration.png'}, {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
