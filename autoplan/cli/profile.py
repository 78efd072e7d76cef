"""``autoplan profile``: measure this machine into a profile file, or check and show one.

autoplan profile --devices N --out profiles/NAME.yaml [--model MODEL.py --batch B] [--threads T]
autoplan profile --show NAME_OR_PATH
autoplan profile --refresh op_overhead|comm_overlap --out PROFILE.yaml   # re-measure one part in place
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from autoplan.errors import ProfileError
from autoplan.types.profile import Profile

REFRESHABLE = ("op_overhead", "comm_overlap")


def register(subparsers: Any, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "profile",
        parents=[common],
        help="measure this machine into a hardware profile, or check one",
        description="Measure compute and memory bandwidth (all N processes at once) and N-process "
        "collectives on this machine and write a profile (see docs/profile-format.md); or check and show a profile.",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=2,
        help="processes (GPUs, or CPU ranks) that compute at once and measure collectives between (default 2)",
    )
    parser.add_argument(
        "--links-from",
        metavar="PROFILE",
        help="with --devices 1 (a single-GPU machine, nothing to measure collectives between): take the links, "
        "overlap and devices per node from this profile (name or path) of the cluster the device stands for",
    )
    parser.add_argument("--out", help="where to write the profile (.yaml or .json)")
    parser.add_argument("--name", help="profile name (default: the --out file stem)")
    parser.add_argument("--threads", type=int, help="intra-op threads per process (default: cores // devices)")
    parser.add_argument("--model", help="also time each traced op of this model file")
    parser.add_argument("--batch", type=int, default=1, help="global batch for --model (default 1)")
    parser.add_argument("--quick", action="store_true", help="a small sweep (seconds), for smoke tests")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before the measuring processes are stopped (default 300)"
    )
    parser.add_argument(
        "--show", metavar="PROFILE", help="load, validate and summarise a profile (name or path) instead of measuring"
    )
    parser.add_argument(
        "--refresh",
        choices=REFRESHABLE,
        help="re-measure only this part of the existing --out profile (with its "
        "devices_per_node and threads) and rewrite the file",
    )
    parser.set_defaults(func=run, out_kind="file")


def run(args: argparse.Namespace) -> int:
    from autoplan.profile.io import load_profile, save_profile

    if args.show:
        profile = load_profile(args.show)
        _print(summary(profile), args)
        return 0
    _check_args(args)
    if args.refresh:
        return refresh(args)
    from autoplan.profile.measure import measure_profile
    from autoplan.profile.measure.collectives import CommSweep
    from autoplan.profile.measure.compute import QUICK_SWEEP, default_sweep
    from autoplan.profile.measure.timing import default_device

    started = time.perf_counter()
    quick_comm = CommSweep(max_bytes=4 * 2**20, factor=4)
    profile = measure_profile(
        devices=args.devices,
        name=args.name or _stem(args.out),
        threads=args.threads,
        compute_sweep=QUICK_SWEEP if args.quick else default_sweep(default_device()),
        comm_sweep=quick_comm if args.quick else CommSweep(),
        model=args.model,
        batch=args.batch,
        progress=not (args.quiet or args.json),
        timeout_s=args.timeout,
        links_from=load_profile(args.links_from) if args.links_from else None,
    )
    path = save_profile(profile, args.out)
    _print({**summary(profile), "written": str(path), "wall_s": round(time.perf_counter() - started, 1)}, args)
    return 0


def refresh(args: argparse.Namespace) -> int:
    """Re-measure one part (``--refresh``) of the profile at ``--out`` and write it back."""
    from autoplan.profile.io import load_profile, save_profile
    from autoplan.profile.measure import measure_comm_overlap, measure_op_overhead

    started = time.perf_counter()
    profile = load_profile(args.out)
    devices, threads = profile.devices_per_node, profile.threads or args.threads
    if args.refresh == "op_overhead":
        profile.device.op_overhead = measure_op_overhead(devices=devices, threads=threads, timeout_s=args.timeout)
    else:
        profile.comm_overlap = measure_comm_overlap(devices=devices, threads=threads, timeout_s=args.timeout)
    path = save_profile(profile, args.out)
    _print({**summary(profile), "written": str(path), "wall_s": round(time.perf_counter() - started, 1)}, args)
    return 0


def _check_args(args: argparse.Namespace) -> None:
    if not args.out:
        raise ProfileError("autoplan profile needs --out PATH.yaml (or --show PROFILE to check an existing one).")
    if args.devices < 1:
        raise ProfileError(f"--devices is {args.devices}; expected an integer >= 1.")
    if args.devices == 1 and not args.links_from and not args.refresh:
        raise ProfileError(
            "--devices 1 has no collective to measure; add --links-from PROFILE (e.g. dgx-h200) to take the links "
            "from the cluster this device stands for, or measure with --devices 2 or more."
        )
    if args.links_from and args.devices != 1:
        raise ProfileError(f"--links-from is for --devices 1; with --devices {args.devices} the links are measured.")
    if args.threads is not None and args.threads < 1:
        raise ProfileError(f"--threads is {args.threads}; expected an integer >= 1.")
    if args.batch < 1:
        raise ProfileError(f"--batch is {args.batch}; expected an integer >= 1.")


def _stem(path: str) -> str:
    from pathlib import Path

    return Path(path).stem


def summary(profile: Profile) -> dict[str, Any]:
    """The headline numbers of a profile, in SI units."""
    device = profile.device
    links = {"intra_node": profile.intra_node, "inter_node": profile.inter_node}
    return {
        "name": profile.name,
        "device": device.name,
        "devices_per_node": profile.devices_per_node,
        "backend": profile.backend,
        "threads": profile.threads,
        "memory_bytes": device.memory_bytes,
        "peak_flops": device.peak_flops,
        "memory_bandwidth_bytes_per_s": device.memory_bandwidth_bytes_per_s,
        "efficiency": {k: [round(v.max_efficiency, 3), v.half_saturation_flops] for k, v in device.efficiency.items()},
        "op_overhead_s": None
        if device.op_overhead is None
        else {"forward_s": device.op_overhead.forward_s, "backward_s": device.op_overhead.backward_s},
        "links": {
            name: {
                k: {"alpha_s": f.alpha_s, "busbw_bytes_per_s": f.busbw_bytes_per_s} for k, f in link.collectives.items()
            }
            for name, link in links.items()
            if link is not None
        },
        "price_per_device_hour": profile.price_per_device_hour,
        "host": None if profile.host is None else {k: v for k, v in asdict(profile.host).items() if "source" not in k},
    }


def _print(data: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(data, indent=2))
        return
    if args.quiet:
        return
    from rich.console import Console

    from autoplan.display import FitTable, si_text

    console = Console()
    console.print(
        f"[bold]{data['name']}[/]: {data['device']}, {data['devices_per_node']} per node, "
        f"backend {data['backend']}, threads {data['threads']}"
    )
    console.print(
        "peak FLOP/s: "
        + ", ".join(f"{k} {v / 1e12:.3g} T" for k, v in data["peak_flops"].items())
        + f"; memory {si_text(data['memory_bandwidth_bytes_per_s'], 'B/s')}"
    )
    if data["op_overhead_s"]:
        console.print(
            f"host overhead per op: forward {data['op_overhead_s']['forward_s'] * 1e6:.1f} us, "
            f"backward {data['op_overhead_s']['backward_s'] * 1e6:.1f} us"
        )
    if data.get("host"):  # what offload is priced with (docs/profile-format.md, "The host section")
        host = data["host"]
        console.print(
            f"host per device: memory {si_text(host['host_memory_bytes_per_device'], 'B')}, link "
            f"{si_text(host['link_bytes_per_s'], 'B/s')} per direction, "
            f"CPU Adam {host['adam_params_per_s']:.3g} params/s"
        )
    headers = ["link", "collective", "alpha (µs)", "busbw (GB/s)"]
    table = FitTable(headers=headers, numbers=set(headers[2:]))
    for link, fits in data["links"].items():
        for kind, fit in fits.items():
            table.add_row(link, kind, f"{fit['alpha_s'] * 1e6:.1f}", f"{fit['busbw_bytes_per_s'] / 1e9:.3g}")
    console.print(table)
    if "written" in data:
        console.print(f"wrote {data['written']} in {data['wall_s']} s")
