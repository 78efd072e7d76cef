"""How well does a freshly measured profile predict sizes it was not fitted on?

1. Measure a profile of this machine (compute sweep; collectives at 1 KB * 4^i up to 256 MB).
2. Measure HELD-OUT matmul, attention (causal and full) and grouped-GEMM shapes (none in the sweep)
   and collective sizes 2 KB * 4^i (between the fitted sizes) the way the profile was measured: the
   same thread count, all N processes computing at once (median over ranks), forward + backward.
3. Predict each from the profile: matmul t = (F + F_half) / (a * peak[dtype]) with the dtype's
   curve; attention the cost model's forward (F) + backward (2F) on the attention curve; a grouped
   GEMM of E experts as 3E expert GEMMs on the grouped_matmul curve (cost/moe/experts.py);
   collective t = alpha + c(n) * S / busbw. Print the error table; write CSV to
   benchmarks/results/profile_accuracy.csv.

Run:  python benchmarks/profile_accuracy.py [--devices 2]
Timings on a shared machine are noisy; errors are |pred - meas| / meas.
"""

from __future__ import annotations

import argparse
import statistics

from _results import write_results
from rich.console import Console
from rich.table import Table

from autoplan.profile import measure_profile
from autoplan.profile.fit import predict_collective_s, predict_op_s
from autoplan.profile.measure import CommSweep, merge_compute
from autoplan.profile.measure.collectives import merge_collectives
from autoplan.profile.measure.compute import kernel_calls, spec
from autoplan.profile.measure.ranks import ComputeJob, run_ranks

HELD_OUT_MATMULS = [
    (96, 96, 96),
    (192, 192, 192),
    (384, 384, 384),
    (768, 768, 768),
    (1536, 1536, 1536),
    (3000, 1000, 500),
    (1536, 512, 2048),
    (200, 4000, 1000),
    (8192, 128, 256),
    (512, 3072, 768),
]
HELD_OUT_ATTENTION = [(1, 4, 96, 64, 1), (1, 8, 192, 64, 0), (2, 8, 384, 64, 1), (1, 8, 768, 64, 0), (4, 4, 128, 32, 1)]
HELD_OUT_GROUPED = [(4, 48, 192, 192), (8, 96, 384, 256), (16, 64, 256, 512)]  # (experts, rows each, k, n)
FIT_COMM = CommSweep(min_bytes=1024, max_bytes=256 * 2**20, factor=4)
HELD_OUT_COMM = CommSweep(min_bytes=2048, max_bytes=128 * 2**20, factor=4)


def held_out_job(profile) -> ComputeJob:
    cases = (
        [spec("matmul", m=m, n=n, k=k) for m, n, k in HELD_OUT_MATMULS]
        + [spec("attention", batch=b, heads=h, seq=s, head_dim=d, causal=c) for b, h, s, d, c in HELD_OUT_ATTENTION]
        + [spec("grouped_matmul", experts=e, m=m, k=k, n=n) for e, m, k, n in HELD_OUT_GROUPED]
    )
    return ComputeJob(items=tuple((c, dtype) for dtype in profile.device.peak_flops for c in cases), budget_s=0.3)


def compute_rows(profile, job: ComputeJob, per_rank) -> list[dict]:
    rows, _ = merge_compute(job, per_rank)
    out = []
    for row in rows:
        curve = profile.device.efficiency_for(row.op, row.dtype)
        # fwd+bwd rows (attention, and matmuls timed as a training linear): one forward and one backward op;
        # grouped GEMMs: each expert's forward once and its backward twice (compute.kernel_calls = 3E)
        count = kernel_calls(row.op, row.shape)
        if row.op == "grouped_matmul":
            calls = [row.flops / count] * count
        else:
            calls = [row.flops / 3, 2 * row.flops / 3] if row.shape.endswith("fwd+bwd") else [row.flops]
        predicted = sum(
            predict_op_s(
                flops=f,
                peak_flops=profile.device.peak_flops[row.dtype],
                max_efficiency=curve.max_efficiency,
                half_saturation_flops=curve.half_saturation_flops,
            )
            for f in calls
        )
        out.append(_row(row.op, row.shape, row.dtype, row.time_s, predicted))
    return out


def collective_rows(profile, per_rank, devices: int) -> list[dict]:
    points = merge_collectives(
        {r: res.collectives for r, res in per_rank.items()}, processes=devices, sweep=HELD_OUT_COMM
    )
    rows = []
    for kind, pts in points.items():
        fit = profile.intra_node.collectives[kind]
        for group, size, measured in pts:
            predicted = predict_collective_s(
                kind=kind,
                group_size=int(group),
                message_bytes=size,
                alpha_s=fit.alpha_s,
                busbw_bytes_per_s=fit.busbw_bytes_per_s,
            )
            rows.append(_row(kind, f"{int(size)} B", f"n={int(group)}", measured, predicted))
    return rows


def _row(kind: str, shape: str, what: str, measured: float, predicted: float) -> dict:
    return {
        "kind": kind,
        "shape": shape,
        "dtype_or_group": what,
        "measured_s": measured,
        "predicted_s": predicted,
        "error_pct": 100.0 * (predicted - measured) / measured,
    }


def show(rows: list[dict]) -> None:
    table = Table("kind", "shape", "dtype/group", "measured", "predicted", "error")
    for r in rows:
        table.add_row(
            r["kind"],
            r["shape"],
            r["dtype_or_group"],
            f"{r['measured_s'] * 1e3:.3f} ms",
            f"{r['predicted_s'] * 1e3:.3f} ms",
            f"{r['error_pct']:+.1f}%",
        )
    summary = Table("kind", "dtype/group", "points", "median |error|", "max |error|")
    for key in dict.fromkeys((r["kind"], r["dtype_or_group"]) for r in rows):
        errs = [abs(r["error_pct"]) for r in rows if (r["kind"], r["dtype_or_group"]) == key]
        summary.add_row(*key, str(len(errs)), f"{statistics.median(errs):.1f}%", f"{max(errs):.1f}%")
    console = Console()
    console.print(table)
    console.print(summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    profile = measure_profile(devices=args.devices, name="benchmark", comm_sweep=FIT_COMM)
    job = held_out_job(profile)
    _, per_rank = run_ranks(
        processes=args.devices, threads=profile.threads, job=job, sweep=HELD_OUT_COMM, timeout_s=600
    )
    rows = compute_rows(profile, job, per_rank) + collective_rows(profile, per_rank, args.devices)
    show(rows)
    write_results(rows, "profile_accuracy")


if __name__ == "__main__":
    main()
