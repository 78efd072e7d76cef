"""``autoplan calibrate RUNDIR... --profile P --out P2.yaml``: refit a profile from measured runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SUFFIXES = (".yaml", ".yml", ".json")


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        parents=[common],
        help="refit a profile's efficiency and link numbers from measured runs",
        description="Refit a profile so the cost model matches the median step times of `autoplan run` folders; "
        "write the calibrated profile, recording what it was fitted from.",
    )
    parser.add_argument(
        "runs", nargs="+", metavar="RUNDIR", help="run folders written by `autoplan run ... --out RUNDIR`"
    )
    parser.add_argument("--profile", required=True, help="profile the runs were planned with (name or path)")
    parser.add_argument(
        "--out", required=True, metavar="P2.yaml", help="where to write the calibrated profile (.yaml or .json)"
    )
    parser.add_argument(
        "--noise-sigma", type=float, default=0.05, help="log std of a measured median step time (default 0.05)"
    )
    parser.add_argument(
        "--prior-sigma", type=float, default=1.0, help="log std of the prior on each refitted number (default 1.0)"
    )
    parser.set_defaults(func=run, out_kind="file")


def run(args: argparse.Namespace) -> int:
    from autoplan.calibrate.api import calibrate
    from autoplan.calibrate.fit import FitOptions
    from autoplan.calibrate.runs import CalibrationError
    from autoplan.profile import save_profile

    if Path(args.out).suffix not in SUFFIXES:
        raise CalibrationError(
            f"--out '{args.out}' has suffix '{Path(args.out).suffix}'; expected one of {', '.join(SUFFIXES)}."
        )
    for name in ("noise_sigma", "prior_sigma"):
        if not getattr(args, name) > 0:
            raise CalibrationError(
                f"--{name.replace('_', '-')} {getattr(args, name)} is not positive; pass a log standard deviation > 0."
            )
    result = calibrate(
        args.runs, profile=args.profile, options=FitOptions(noise_sigma=args.noise_sigma, prior_sigma=args.prior_sigma)
    )
    path = save_profile(result.profile, args.out)
    if args.json:
        print(json.dumps(result.profile.calibration, indent=2))
    elif not args.quiet:
        _print(result.profile.calibration, path)
    return 0


def _print(calibration: dict, path: Path) -> None:
    from rich.console import Console

    from autoplan.display import FitTable

    console = Console()
    numbers = {"measured", "before", "after"}
    headers = ["run", "plan", "measured", "before", "after"]
    runs = FitTable(headers=headers, numbers=numbers, title="runs: step time (s)")
    for row in calibration["runs"]:
        runs.add_row(
            Path(row["folder"]).name,
            row["plan"],
            f"{row['measured_step_time_s']:.4f}",
            f"{row['predicted_before_s']:.4f}",
            f"{row['predicted_after_s']:.4f}",
        )
    console.print(runs)
    params = FitTable(headers=["parameter", "before", "after"], numbers=numbers, title="refitted numbers")
    for name, change in calibration["parameters"].items():
        params.add_row(name, f"{change['before']:.4g}", f"{change['after']:.4g}")
    console.print(params)
    before, after = calibration["error_before"], calibration["error_after"]
    console.print(
        f"abs error median {before['median_abs_pct']:.1f}% -> {after['median_abs_pct']:.1f}%, "
        f"max {before['max_abs_pct']:.1f}% -> {after['max_abs_pct']:.1f}%;  wrote {path}"
    )
