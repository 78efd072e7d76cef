"""Goodput against cluster size for a large GPT, under published failure rates.

For a Llama-3-405B-sized and a GPT-3-175B-sized dense model (checkpoint = 12 bytes per
parameter: fp32 weights and AdamW's two moments, as autoplan's executor saves them), on the
shipped dgx-h100 profile (Llama 3 paper: 419 unexpected interruptions in 54 days on 16,384
H100s; Tectonic storage, 2 TB/s sustained and 7 TB/s peak) and dgx-a100 profile (Kokolis et al.
2024: job MTTF 1.8 h at 16,384 A100s; the same storage), at 1,024 to 65,536 devices: the
job's mean time between failures, the checkpoint write, Young's and Daly's intervals, the
expected goodput (autoplan/cost/run/reliability.py) with synchronous saves and with asynchronous
ones (staging the device's 1/N share to host memory), and the hours lost per day of wall time.
The storage does not grow with the cluster past its 7 TB/s peak. No plan is searched: the
numbers depend only on the parameter count, the device count and the profile. restart_s is the
profiles' stated assumption (10 min); ``--restart-s`` changes it.

    python benchmarks/goodput.py [--restart-s S] [--out benchmarks/results/goodput.csv]
"""

from __future__ import annotations

import argparse
import dataclasses

from _results import write_results

from autoplan.cost.run.reliability import expected_goodput
from autoplan.profile import load_profile

MODELS = {"llama3-405b": 405e9, "gpt3-175b": 175e9}  # parameters (Dubey et al. 2024; Brown et al. 2020)
PROFILES = ("dgx-h100", "dgx-a100")
DEVICES = (1024, 4096, 16384, 65536)


def rows(*, restart_s: float | None = None) -> list[dict]:
    out = []
    for profile_name in PROFILES:
        profile = load_profile(profile_name)
        if restart_s is not None:
            profile.reliability = dataclasses.replace(profile.reliability, restart_s=restart_s)
        for model, params in MODELS.items():
            for devices in DEVICES:
                sync = expected_goodput(params=params, devices=devices, profile=profile)
                background = expected_goodput(params=params, devices=devices, profile=profile, async_save=True)
                out.append(
                    {
                        "profile": profile_name,
                        "model": model,
                        "devices": devices,
                        "checkpoint_gb": sync.checkpoint_bytes / 1e9,
                        "write_s": sync.checkpoint_write_s,
                        "job_mtbf_h": sync.job_mtbf_s / 3600,
                        "young_interval_s": sync.young_interval_s,
                        "daly_interval_s": sync.checkpoint_interval_s,
                        "goodput": sync.expected_goodput,
                        "lost_h_per_day": 24 * sync.lost_fraction,
                        "async_interval_s": background.checkpoint_interval_s,
                        "async_goodput": background.expected_goodput,
                    }
                )
    return out


def _print(table_rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="expected goodput vs cluster size (autoplan/cost/run/reliability.py)")
    columns = (
        "profile",
        "model",
        "devices",
        "ckpt GB",
        "write s",
        "job MTBF h",
        "Young s",
        "Daly s",
        "goodput",
        "lost h/day",
        "async Daly s",
        "async goodput",
    )
    for name in columns:
        table.add_column(name, justify="left" if name in ("profile", "model") else "right", no_wrap=True)
    for r in table_rows:
        table.add_row(
            r["profile"],
            r["model"],
            f"{r['devices']:,}",
            f"{r['checkpoint_gb']:,.0f}",
            f"{r['write_s']:.2f}",
            f"{r['job_mtbf_h']:.2f}",
            f"{r['young_interval_s']:.0f}",
            f"{r['daly_interval_s']:.0f}",
            f"{100 * r['goodput']:.1f}%",
            f"{r['lost_h_per_day']:.2f}",
            f"{r['async_interval_s']:.0f}",
            f"{100 * r['async_goodput']:.1f}%",
        )
    Console(width=200).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restart-s", type=float, default=None, help="override the profiles' restart_s")
    parser.add_argument("--out", default=None, help="CSV path (default benchmarks/results/goodput.csv)")
    args = parser.parse_args()
    table_rows = rows(restart_s=args.restart_s)
    _print(table_rows)
    write_results(table_rows, "goodput", path=args.out)


if __name__ == "__main__":
    main()
