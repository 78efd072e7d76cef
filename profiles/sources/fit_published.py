"""Build profiles/dgx-a100.yaml, dgx-h100.yaml and dgx-h200.yaml from published figures.

Run:  python profiles/sources/fit_published.py   (prints each fit, rewrites the three files)

Every number below names its source; most are tabulated in ../shared/reference/hardware.csv.
What is fitted, and how (autoplan.profile.fit, robust soft-L1 least squares on relative
residuals):

* matmul efficiency eff(F) = a*F/(F+F_half): fitted to the cuBLASLt GEMM sweeps of the Azure
  AI-benchmarking-guide (A100: FP16, 1024^3..16384^3 plus three rectangular shapes).
  For H100/H200 only FP8 sweeps are published; their curve is fitted against the FP8 dense
  peak, and F_half is rescaled to BF16 by bf16_peak/fp8_peak, which keeps the fitted fixed
  per-call overhead t0 = F_half/(a*peak) unchanged (the model's small-size penalty is a
  fixed time; a slower dtype needs proportionally fewer FLOPs to hide it). The un-rescaled FP8
  fit is the profile's ``efficiency_by_dtype.fp8.matmul`` (what precision "fp8" prices FP8
  linears with, autoplan/cost/compute/roofline.py), beside ``peak_flops.fp8`` = the FP8 dense datasheet peak.
* attention: A100 runs FlashAttention-2: a = its TFLOPS / peak from the same Azure pages (one large
  point, so F_half is taken from the matmul fit: same launch/tail overhead argument). H100/H200:
  forward and backward curves of PyTorch SDPA's FlashAttention-2 and of Transformer Engine's cuDNN
  attention, fitted to the FA3 paper's figures (attention_kernels.py).
* grouped_matmul (H100/H200): a from torch._grouped_mm's BF16 rate in PyTorch PR #156203, F_half from
  the matmul fit (grouped_gemm.py); FP8 grouped GEMMs keep the FP8 matmul curve.
  No conv figures were found, so GPU profiles have no conv curve (the cost model then
  uses matmul's, via DeviceSpec.efficiency_for).
* intra-node all_reduce alpha and busbw: fitted to the nccl-tests all_reduce sweeps (1 KB ..
  8 GB, 8 GPUs) of the Azure pages: t = c(8)*S/busbw_reported, then t = alpha + c*S/busbw.
* other intra-node collectives have no published sweep here. Their busbw: A100 -- the
  all_reduce busbw (nccl-tests PERFORMANCE.md defines busbw so that it is comparable across
  collectives; ring all_reduce = reduce_scatter + all_gather); H100/H200 -- 370 GB/s, the
  non-all_reduce busbw stated by the NCCL maintainer (nccl-tests issue #212), since NVLS only
  speeds up all_reduce. Their alpha: half the all_reduce alpha (Thakur et al. 2005: ring
  all_reduce is 2(n-1) latency steps, all_gather/reduce_scatter (n-1)).
  send_recv busbw: nvbandwidth pairwise copy = 88% of one NVLink direction (stas00/ml-engineering,
  measured on H200: 396.4 of 450 GB/s); A100: 0.881 * 300 GB/s.
* inter-node (groups of >= 2 FULL nodes; the cost model scales busbw by ranks-per-node /
  devices_per_node for partial nodes): node NIC line rate x 0.96, the efficiency NVIDIA's
  NCCL team reports for a DGX A100 (192 GB/s all_reduce busbw on 8x200 Gb/s; NVIDIA/nccl
  issue #812, quoted in #1576). alpha: 46.3 us, the smallest-message 2-node 16-GPU all_reduce
  time published in NVIDIA/nccl issue #1244 (NDR, NCCL 2.21.5); half that for the others.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoplan.profile.fit import bus_factor, fit_collective, fit_efficiency  # noqa: E402
from autoplan.profile.io import save_profile  # noqa: E402
from autoplan.types.profile import (  # noqa: E402
    DEFAULT_OVERLAP_SOURCE,
    CollectiveFit,
    CommOverlap,
    DeviceSpec,
    Efficiency,
    LinkSpec,
    Profile,
)
from autoplan.types.reliability import ReliabilitySpec, StorageSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_kernels import hopper_curves  # noqa: E402
from grouped_gemm import hopper_grouped_curve  # noqa: E402
from host_figures import HOSTS  # noqa: E402

T, G = 1e12, 1e9
AZURE = "Azure/AI-benchmarking-guide Azure_Results/{page} ({what})"
GEMM_SHAPES = [
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 16384, 16384),
    (1024, 2145, 1024),
    (6144, 12288, 12288),
    (802816, 192, 768),
]
GEMM_TFLOPS = {  # cuBLASLt GEMM TFLOPS for GEMM_SHAPES (32768^3 rows of the FP8 tables appended)
    "a100": ([119.4, 221.8, 228.0, 253.7, 256.5, 132.8, 250.8, 157.8], []),
    "h100": ([274.1, 1011.3, 1216.9, 1290.1, 1377.3, 410.7, 1351.4, 663.8], [1382.2]),
    "h200": ([290.8, 1013.4, 1249.1, 1300.6, 1366.3, 407.9, 1318.0, 717.5], [1349.5]),
}
ALLREDUCE_BUSBW_GBS = {  # nccl-tests all_reduce busbw, in-place, 8 GPUs, sizes 1 KiB * 2^i, i = 0..23
    "a100": [
        0.04,
        0.08,
        0.17,
        0.33,
        0.67,
        1.37,
        2.70,
        5.15,
        10.11,
        19.24,
        36.22,
        53.54,
        71.43,
        89.99,
        109.22,
        132.77,
        166.63,
        174.18,
        213.87,
        221.58,
        228.10,
        230.22,
        230.48,
        231.58,
    ],
    "h100": [
        0.07,
        0.14,
        0.27,
        0.53,
        0.95,
        1.71,
        2.72,
        5.40,
        10.86,
        21.35,
        43.70,
        81.93,
        128.73,
        172.13,
        234.45,
        295.53,
        361.78,
        400.61,
        423.38,
        438.46,
        466.35,
        472.36,
        475.54,
        478.87,
    ],
    "h200": [
        0.06,
        0.12,
        0.23,
        0.47,
        0.93,
        1.84,
        3.72,
        7.39,
        14.75,
        29.38,
        52.96,
        88.78,
        138.44,
        181.94,
        240.41,
        300.91,
        368.11,
        412.45,
        432.24,
        442.72,
        467.58,
        472.57,
        477.41,
        479.98,
    ],
}

SYSTEMS = {
    "a100": dict(
        profile="dgx-a100",
        device="NVIDIA A100-SXM4-80GB",
        memory_bytes=80 * 2**30,
        peak={"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
        peak_source="NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4), "
        "dense: FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS",
        hbm=2.039e12,
        hbm_source="NVIDIA A100 80GB SXM datasheet: 2,039 GB/s",
        stream_copy=1.61e12,
        page="ND_A100_v4_results.md",
        gemm_dtype="fp16",
        gemm_peak=312 * T,
        flash_tflops=179.5,
        nvlink_dir=300 * G,
        other_busbw=None,
        other_busbw_source=None,
        nic=200 * G,
        nic_source="8x ConnectX-6 200 Gb/s HDR per DGX A100 (DGX A100 datasheet; Narayanan et al. SC'21)",
    ),
    "h100": dict(
        profile="dgx-h100",
        device="NVIDIA H100-SXM5-80GB",
        memory_bytes=80 * 2**30,
        peak={"fp32": 66.9 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T, "fp8": 1978.9 * T},
        peak_source="NVIDIA H100 SXM datasheet, dense (sparse figures halved): "
        "FP32 66.9, TF32 494.7, BF16/FP16 989.4, FP8 1978.9 TFLOPS",
        hbm=3.35e12,
        hbm_source="NVIDIA H100 SXM datasheet: 3.35 TB/s",
        stream_copy=2.90e12,
        page="ND_H100_v5_results.md",
        gemm_dtype="fp8",
        gemm_peak=1978.9 * T,
        flash_tflops=327.9,
        nvlink_dir=450 * G,
        other_busbw=370 * G,
        other_busbw_source="NVIDIA/nccl-tests issue #212, NCCL maintainer: "
        "effective NVLink busbw 370 GB/s for non-all_reduce ops on 8x H100",
        nic=400 * G,
        nic_source="8x ConnectX-7 400 Gb/s NDR per DGX H100 (NVIDIA DGX H100 user guide via stas00/ml-engineering)",
    ),
    "h200": dict(
        profile="dgx-h200",
        device="NVIDIA H200-SXM-141GB",
        memory_bytes=141 * 10**9,
        peak={"fp32": 66.9 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T, "fp8": 1978.9 * T},
        peak_source="same GH100 compute as H100 SXM (NVIDIA H200 announcement; hardware.csv): "
        "dense FP32 66.9, TF32 494.7, BF16/FP16 989.4, FP8 1978.9 TFLOPS",
        hbm=4.8e12,
        hbm_source="NVIDIA H200 datasheet: 4.8 TB/s HBM3e",
        stream_copy=4.01e12,
        page="ND_H200_v5_results.md",
        gemm_dtype="fp8",
        gemm_peak=1978.9 * T,
        flash_tflops=329.3,
        nvlink_dir=450 * G,
        other_busbw=370 * G,
        other_busbw_source="NVIDIA/nccl-tests issue #212, NCCL maintainer: effective NVLink4 busbw 370 GB/s "
        "for non-all_reduce ops (same NVLink4/NVSwitch as H100)",
        nic=400 * G,
        nic_source="8x ConnectX-7 400 Gb/s NDR per DGX H200 "
        "(NVIDIA DGX H100/H200 user guide via stas00/ml-engineering)",
    ),
}
SEND_RECV_FRACTION = 396.4 / 450  # stas00/ml-engineering: nvbandwidth pairwise copy on 8x H200
INTER_EFFICIENCY = 192 / 200  # NVIDIA/nccl #812 (in #1576): 192 GB/s all_reduce busbw on DGX A100, 8x200 Gb/s
INTER_ALPHA_S = 46.3e-6  # NVIDIA/nccl #1244: smallest-message time, 2 nodes x 8 GPUs, NDR


LLAMA3_GPUS = 16384
TECTONIC_SUSTAINED, TECTONIC_PEAK = 2e12, 7e12
STORAGE_SOURCE = (
    "Llama 3 paper (Dubey et al. 2024, 'The Llama 3 Herd of Models', section 3.3.1): Tectonic, 240 PB on 7,500 "
    "SSD servers, 2 TB/s sustained and 7 TB/s peak for the 16K-GPU Llama 3 405B cluster; per device = 2 TB/s / "
    "16,384 GPUs (write and read alike), max_total = the 7 TB/s peak"
)
STAGING = {  # device-to-host copy bytes/s per device, for an asynchronous save's blocking staging
    "a100": (
        0.88 * 31.5e9,
        "; staging: PCIe Gen4 x16 (A100 datasheet, 31.5 GB/s per direction) x 0.88, the fraction of PCIe5 x16 "
        "that nvbandwidth measures on H200 (stas00/ml-engineering)",
    ),
    "h100": (55.06e9, "; staging: PCIe5 x16 D2H 55.06 GB/s measured with nvbandwidth on H200 (stas00/ml-engineering)"),
    "h200": (55.06e9, "; staging: PCIe5 x16 D2H 55.06 GB/s measured with nvbandwidth on H200 (stas00/ml-engineering)"),
}
LLAMA3_RATE = 419 / (LLAMA3_GPUS * 54 * 24)  # unexpected interruptions per GPU-hour
LLAMA3_SOURCE = (
    "Llama 3 paper (Dubey et al. 2024, section 3.3.4): 419 unexpected job interruptions in a 54-day snapshot of "
    "Llama 3 405B pre-training on 16,384 H100 GPUs (466 in all, 47 planned; ~78% attributed to confirmed or "
    "suspected hardware): 419 / (16,384 x 54 x 24 GPU-hours)"
)
RELIABILITY = {
    "a100": (
        1 / (1.8 * LLAMA3_GPUS),
        "Kokolis et al. 2024, 'Revisiting Reliability in Large-Scale Machine Learning Research Clusters' "
        "(arXiv 2410.21680, HPCA 2025), A100 clusters RSC-1/RSC-2: projected job MTTF 1.8 h at 16,384 GPUs "
        "(7.9 h at 1,024, ~14 min at 131,072), as quoted by clockwork.io ('Common approaches to fault-tolerant AI "
        "training'); rate = 1 / (1.8 h x 16,384)",
    ),
    "h100": (LLAMA3_RATE, LLAMA3_SOURCE),
    "h200": (LLAMA3_RATE, LLAMA3_SOURCE + "; no published H200 fleet figure was found, the same-generation H100 one"),
}
RESTART_S = 600.0
RESTART_SOURCE = (
    "assumed, not measured: 10 min to detect a failure (collective timeout), reschedule, relaunch and "
    "re-initialise the job (the checkpoint read is priced from storage); no published per-restart time was "
    "found; replace it with your cluster's"
)


def storage_spec(key: str) -> StorageSpec:
    staging, staging_source = STAGING[key]
    share = TECTONIC_SUSTAINED / LLAMA3_GPUS
    return StorageSpec(
        write_bytes_per_s_per_device=share,
        read_bytes_per_s_per_device=share,
        max_total_bytes_per_s=TECTONIC_PEAK,
        staging_bytes_per_s_per_device=staging,
        source=STORAGE_SOURCE + staging_source,
    )


def reliability_spec(key: str) -> ReliabilitySpec:
    rate, source = RELIABILITY[key]
    return ReliabilitySpec(
        failures_per_device_hour=rate, restart_s=RESTART_S, source=source, restart_source=RESTART_SOURCE
    )


def matmul_curve(key: str, spec: dict) -> tuple[Efficiency, Efficiency | None, list]:
    """The bf16 (or fp16) matmul curve and, where the sweep is FP8, the un-rescaled FP8 one."""
    main, extra = GEMM_TFLOPS[key]
    shapes = GEMM_SHAPES + [(32768, 32768, 32768)] * len(extra)
    flops = [2.0 * m * n * k for m, n, k in shapes]
    times = [f / (tf * T) for f, tf in zip(flops, main + extra)]
    a, half = fit_efficiency(flops=flops, time_s=times, peak_flops=[spec["gemm_peak"]] * len(flops))
    half_bf16 = half * spec["peak"]["bf16"] / spec["gemm_peak"]
    print(f"{key} matmul ({spec['gemm_dtype']}): a={a:.3f} F_half={half:.3g} -> bf16 F_half={half_bf16:.3g}")
    for (m, n, k), f, t in zip(shapes, flops, times):
        pred = a * f / (f + half)
        print(f"   {m}x{n}x{k}: published eff {f / t / spec['gemm_peak']:.3f}  fitted {pred:.3f}")
    sweep = AZURE.format(
        page=spec["page"], what=f"cuBLASLt {spec['gemm_dtype'].upper()} GEMM sweep, {len(flops)} shapes"
    )
    fitted = f"; least-squares fit by profiles/sources/fit_published.py (F_half fitted {half:.3g} FLOP"
    fp8 = spec["gemm_dtype"] == "fp8"
    source = sweep + fitted + (", rescaled to BF16 by bf16/fp8 peak" if fp8 else "") + ")"
    main_curve = Efficiency(max_efficiency=a, half_saturation_flops=half_bf16, source=source)
    fp8_curve = (
        Efficiency(max_efficiency=a, half_saturation_flops=half, source=sweep + fitted + ", against the FP8 peak)")
        if fp8
        else None
    )
    return main_curve, fp8_curve, list(zip(flops, times))


def fp8_curves(fp8_matmul: Efficiency | None, *, grouped: bool) -> dict:
    """``efficiency_by_dtype``: the FP8 matmul fit, which FP8 grouped GEMMs also use where a BF16 grouped
    curve exists (grouped_gemm.py has no FP8 figure; without this they would take the BF16 one)."""
    if fp8_matmul is None:
        return {}
    return {"fp8": {"matmul": fp8_matmul, **({"grouped_matmul": fp8_matmul} if grouped else {})}}


def allreduce_fit(key: str, spec: dict) -> CollectiveFit:
    c = bus_factor(kind="all_reduce", group_size=8)
    points = [[8, float(1024 * 2**i), c * 1024 * 2**i / (bw * G)] for i, bw in enumerate(ALLREDUCE_BUSBW_GBS[key])]
    alpha, busbw = fit_collective(kind="all_reduce", points=points)
    print(f"{key} all_reduce intra: alpha={alpha * 1e6:.1f} us busbw={busbw / G:.1f} GB/s")
    source = (
        AZURE.format(page=spec["page"], what="nccl-tests all_reduce busbw 1 KB..8 GB, 8 GPUs")
        + "; robust fit by profiles/sources/fit_published.py"
    )
    return CollectiveFit(alpha_s=alpha, busbw_bytes_per_s=busbw, source=source, points=points)


def intra_link(key: str, spec: dict) -> LinkSpec:
    ar = allreduce_fit(key, spec)
    other = spec["other_busbw"] or ar.busbw_bytes_per_s
    other_src = (
        spec["other_busbw_source"]
        or "all_reduce busbw fit (nccl-tests PERFORMANCE.md: busbw is comparable across collectives)"
    )
    half_alpha = "; alpha = all_reduce alpha / 2 (Thakur et al. 2005: (n-1) vs 2(n-1) latency steps)"
    fits = {"all_reduce": ar}
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        fits[kind] = CollectiveFit(alpha_s=ar.alpha_s / 2, busbw_bytes_per_s=other, source=other_src + half_alpha)
    fits["send_recv"] = CollectiveFit(
        alpha_s=ar.alpha_s / 2,
        busbw_bytes_per_s=SEND_RECV_FRACTION * spec["nvlink_dir"],
        source=f"{SEND_RECV_FRACTION:.3f} x {spec['nvlink_dir'] / G:.0f} GB/s per-direction NVLink "
        "(stas00/ml-engineering nvbandwidth on H200: 396.4 of 450 GB/s)" + half_alpha,
    )
    return LinkSpec(name="NVLink + NVSwitch", collectives=fits)


def inter_link(spec: dict) -> LinkSpec:
    busbw = spec["nic"] * INTER_EFFICIENCY
    source = (
        f"{spec['nic_source']} x {INTER_EFFICIENCY:.2f} "
        "(NVIDIA/nccl issue #812: 192 GB/s busbw on DGX A100 8x200 Gb/s); "
        f"alpha {INTER_ALPHA_S * 1e6:.1f} us from NVIDIA/nccl issue #1244 "
        "(2-node 16-GPU smallest-message all_reduce), half for the others"
    )
    fits = {
        kind: CollectiveFit(
            alpha_s=INTER_ALPHA_S if kind == "all_reduce" else INTER_ALPHA_S / 2, busbw_bytes_per_s=busbw, source=source
        )
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
    }
    return LinkSpec(name="InfiniBand, rail-optimised, busbw per full node", collectives=fits)


def build(key: str, spec: dict) -> Profile:
    matmul, fp8_matmul, _ = matmul_curve(key, spec)
    flash_a = spec["flash_tflops"] * T / spec["peak"]["bf16"]
    attention = Efficiency(
        max_efficiency=flash_a,
        half_saturation_flops=matmul.half_saturation_flops,
        source=AZURE.format(page=spec["page"], what=f"Flash Attention 2.0 {spec['flash_tflops']} TFLOPS, seq 8192")
        + "; F_half from the matmul fit",
    )
    hopper = key in ("h100", "h200")
    attention_curves = hopper_curves(spec["peak"]["bf16"]) if hopper else {"attention": attention}
    grouped = {"grouped_matmul": hopper_grouped_curve(spec["peak"]["bf16"], matmul)} if hopper else {}
    device = DeviceSpec(
        name=spec["device"],
        memory_bytes=spec["memory_bytes"],
        peak_flops=spec["peak"],
        memory_bandwidth_bytes_per_s=spec["hbm"],
        efficiency={"matmul": matmul, **attention_curves, **grouped},
        efficiency_by_dtype=fp8_curves(fp8_matmul, grouped=bool(grouped)),
        memory_efficiency=spec["stream_copy"] / spec["hbm"],
        source=f"{spec['peak_source']}; {spec['hbm_source']}; "
        f"memory_efficiency = STREAM copy {spec['stream_copy'] / 1e12:.2f} TB/s "
        + AZURE.format(page=spec["page"], what="HBM bandwidth")
        + " / datasheet",
    )
    return Profile(
        name=spec["profile"],
        device=device,
        devices_per_node=8,
        intra_node=intra_link(key, spec),
        inter_node=inter_link(spec),
        backend="nccl",
        description=f"DGX node of 8x {spec['device']}, "
        "built from published figures by profiles/sources/fit_published.py.",
        storage=storage_spec(key),
        reliability=reliability_spec(key),
        comm_overlap=CommOverlap(efficiency=1.0, source=DEFAULT_OVERLAP_SOURCE + " (no SM contention modelled)"),
        host=HOSTS[spec["profile"]],
    )


def main() -> None:
    out = Path(__file__).resolve().parents[1]
    for key, spec in SYSTEMS.items():
        path = save_profile(build(key, spec), out / f"{spec['profile']}.yaml")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
