"""Expert-parallel plans of the MoE example: predicted against measured on this machine.

    python -m benchmarks.moe_accuracy [--space quick|default|full] [--steps S] [--devices 2,4]

1. Profile this machine for 2 and for 4 processes (`autoplan profile --devices N`), unless
   benchmarks/results/moe_accuracy/cpu-here-N.yaml exists: a CPU profile describes the machine
   it was measured on, and the shipped cpu-gloo profile is another CPU's (and 2 processes only).
2. Trace examples/moe.py (a top-2 MoE transformer at sizes where a step takes about a second
   here) and enumerate every plan with expert parallelism (ep > 1) the planner's space allows on
   N processes: degrees and ep, micro-batch sizes, schedules, ZeRO stages; recomputation "none",
   plus the other choices on the first plan of each degree ("default"; "full": all of them).
   Each configuration is pinned and handed to the planner, which fills in its stages.
3. Run each with `autoplan run --steps S --audit` (resumable, as benchmarks/calibration does).
4. Per device count: median and max |predicted - measured| / measured, Spearman's rank
   correlation, and the planner's choice among these plans against the measured fastest
   (benchmarks/calibration/report.py, the calibration benchmark's statistics).

Writes benchmarks/results/moe_accuracy/{moe_accuracy.csv, summary.json} and one run folder per plan.
The machine has 2 cores: 4-process runs share them, and timings are noisy (each run's spread is
in the CSV).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from autoplan.calibrate.runs import environment
from autoplan.errors import PlanError
from autoplan.profile import load_profile
from autoplan.solve import space
from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file
from autoplan.types.cost import Cost
from benchmarks.calibration import report
from benchmarks.calibration.plans import Config
from benchmarks.calibration.runs import run_plan, slug

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "moe_accuracy"
MODEL = "examples/moe.py"
ENV = {"AUTOPLAN_MOE_LAYERS": "2", "AUTOPLAN_MOE_DIM": "256", "AUTOPLAN_MOE_EXPERTS": "4", "AUTOPLAN_MOE_SEQ": "128"}
BATCH = 8


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", choices=("quick", "default", "full"), default="default")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--devices", default="2,4")
    parser.add_argument("--fresh", action="store_true", help="re-run plans that already have results")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    return parser.parse_args(argv)


def here_profile(devices: int):
    """This machine's profile for ``devices`` processes, measured once."""
    path = OUT / f"cpu-here-{devices}.yaml"
    if not path.is_file():
        OUT.mkdir(parents=True, exist_ok=True)
        print(f"profiling this machine for {devices} processes -> {path}", flush=True)
        command = [sys.executable, "-m", "autoplan.cli", "profile", "--devices", str(devices), "--out", str(path)]
        subprocess.run(command, check=True, timeout=1800)
    return load_profile(str(path))


def ep_configs(graph, profile, *, devices: int, name: str) -> list[Config]:
    """Every ep > 1 configuration of the planner's space (module docstring, step 2)."""
    from autoplan.cost.moe.experts import ep_options

    layers, out, plain = len(graph.layers), [], set()
    for deg in space.degree_options(
        devices=devices, per_node=devices, layers=layers, batch=BATCH, fixes={}, eps=tuple(ep_options(graph))
    ):
        if deg.ep == 1:
            continue
        for mbs in space.micro_batch_options(batch=BATCH, dp=deg.dp, fixes={}):
            m = BATCH // (deg.dp * mbs)
            for schedule, v in space.schedule_options(pp=deg.pp, layers=layers, num_microbatches=m, fixes={}):
                for zero in space.zero_options(dp=deg.dp, fixes={}):
                    for recompute in space.recompute_options(fixes={}, layers=layers):
                        first = (deg.dp, deg.ep, deg.pp) not in plain
                        if recompute != "none" and name != "full" and not (first and zero == 0):
                            continue
                        if name == "quick" and (zero or recompute != "none" or mbs != BATCH // deg.dp):
                            continue
                        pins = (("dp", deg.dp), ("ep", deg.ep), ("tp", 1), ("pp", deg.pp), ("mbs", mbs))
                        pins += (("schedule", schedule), ("v", v), ("zero", zero), ("recompute", recompute))
                        out.append(Config(pins + (("precision", "fp32"),)))
                    plain.add((deg.dp, deg.ep, deg.pp))
    return out


def device_rows(devices: int, args: argparse.Namespace) -> list[dict]:
    profile = here_profile(devices)
    with environment(tuple(ENV.items())):
        graph = trace_model_file(str(ROOT / MODEL), BATCH)
    plans = {}
    for config in ep_configs(graph, profile, devices=devices, name=args.space):
        try:
            plans[config.key] = plan_graph(
                graph, devices=devices, profile=profile, batch_size=BATCH, fix=dict(config.pins)
            ).best
        except PlanError as exc:
            print(f"  skipped {config.key}: {exc}")
    chosen = min(plans, key=lambda k: plans[k].predicted.step_time_s) if plans else None
    rows = []
    for index, (key, plan) in enumerate(sorted(plans.items())):
        print(f"[{devices} ranks {index + 1}/{len(plans)}] {plan.describe()}", flush=True)
        done = run_plan(
            model_file=str(ROOT / MODEL),
            env=ENV,
            plan=plan,
            folder=OUT / f"{devices}" / slug(key),
            steps=args.steps,
            fresh=args.fresh,
            timeout_s=args.timeout_s,
        )
        row = {
            "model": f"moe, {devices} ranks",
            "plan": plan.describe(),
            "split": "all",
            "chosen": key == chosen,
            "measured_s": done.measured_s,
            "predicted_s": plan.predicted.step_time_s,
            "folder": str(done.folder),
            "error": done.error,
            "spread_pct": done.spread_pct,
            "predicted_peak_bytes": done.predicted_peak_bytes,
            "measured_peak_bytes": done.measured_peak_bytes,
            "memory_err_pct": report.signed_pct(done.predicted_peak_bytes, done.measured_peak_bytes),
            "measured_rank": None,
            "abs_pct_err": report.ape(plan.predicted.step_time_s, done.measured_s) if done.measured_s else None,
        }
        row.update({k: plan.predicted.breakdown[k] for k in Cost.TIME_FIELDS})
        rows.append(row)
    report.rank(rows)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    rows, summaries = [], {}
    for devices in (int(d) for d in args.devices.split(",")):
        mine = device_rows(devices, args)
        rows += mine
        summaries[f"moe, {devices} ranks"] = report.metrics(mine)
    report.write_csv(OUT / "moe_accuracy.csv", rows)
    (OUT / "summary.json").write_text(json.dumps(summaries, indent=2))
    report.print_table(rows, summaries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
