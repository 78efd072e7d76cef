"""Build profiles/mi300x.yaml, dgx-b200.yaml and gb200-nvl72.yaml from datasheets and published measurements.

Run:  python profiles/sources/other_accelerators.py   (prints each fit, rewrites the three files)

Every number names its source in the profile; how each is used (autoplan.profile.fit: robust soft-L1
least squares on relative residuals, as profiles/sources/fit_published.py):

* peaks: dense datasheet figures (vendors print sparse ones too; halved where only those are given).
* matmul eff(F) = a*F/(F+F_half). Blackwell: fitted to the cuBLASLt FP8 GEMM sweep of Azure's
  ND GB200 v6 page (the shapes of fit_published.GEMM_SHAPES, 32768^3 appended) against the FP8 dense peak,
  the BF16 curve keeping the fitted per-call time t0 = F_half/(a*peak) (fit_published.py's rule); HGX B200
  (same Blackwell GPU at a lower clock) gets the GB200 curves at its own peaks, t0 kept. MI300X: one
  published saturated rate per dtype (SemiAnalysis, BF16 ~620 and FP8 ~990 TFLOP/s) gives a; no MI300X
  sweep was found, so F_half keeps dgx-h100's fitted t0 (the V100 rule of instances.py).
* attention: Azure's FlashAttention-2 figure (seq 8192) / BF16 peak, F_half from the matmul fit, as the
  DGX profiles. MI300X: no published training (forward + backward) attention rate was found, so it has no
  curve and the cost model uses matmul's (DeviceSpec.efficiency_for), which is optimistic.
* intra-node all_reduce: alpha and busbw fitted to a published sweep (MI300X: AMD's rccl-tests sweep on
  8 GPUs; Blackwell: Azure's NCCL ring sweep on one 4-GPU ND GB200 v6 VM); other collectives take that
  busbw (nccl-tests PERFORMANCE.md: comparable across collectives; neither sweep uses NVLS) and half the
  alpha (Thakur et al. 2005), except MI300X all_to_all and send_recv, measured by AMD's TransferBench.
* gb200-nvl72: devices_per_node 72, one NVLink domain, so tp and ep groups may span the 18 compute trays;
  its inter-node link joins racks (one 400 Gb/s NIC per GPU). dgx-b200 and mi300x: 8 per node, 8 NICs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoplan.profile import load_profile  # noqa: E402
from autoplan.profile.fit import bus_factor, fit_collective, fit_efficiency  # noqa: E402
from autoplan.profile.io import save_profile  # noqa: E402
from autoplan.types.pricing import PricingSpec  # noqa: E402
from autoplan.types.profile import CollectiveFit, CommOverlap, DeviceSpec, Efficiency, LinkSpec, Profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_figures import HOSTS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_published  # noqa: E402

T, G = 1e12, 1e9
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
HALF_ALPHA = "; alpha = all_reduce alpha / 2 (Thakur et al. 2005: (n-1) vs 2(n-1) latency steps)"
PRICES = "../shared/reference/gpu_prices.csv"

AZURE_GB200 = "Azure/AI-benchmarking-guide Azure_Results/ND_GB200_v6_results.md ({what})"
GEMM_SHAPES = [*fit_published.GEMM_SHAPES, (32768, 32768, 32768)]  # Azure's sweep, then 32768^3
GB200_FP8_TFLOPS = [489.2, 2243.6, 2834.6, 2876.6, 2906.9, 1022.2, 2895.6, 1459.5, 2825.6]
GB200_FLASH_TFLOPS = 373.9
GB200_ALLREDUCE_BUSBW_GBS = [  # NCCL all_reduce (ring) busbw, in-place, 1 KiB * 2^i, one 4-GPU VM
    0.10, 0.19, 0.38, 0.76, 1.46, 2.88, 5.71, 11.29, 22.41, 44.07, 80.48, 110.43,
    146.27, 253.46, 331.09, 422.62, 550.73, 574.19, 593.53, 618.74, 646.87, 666.63, 673.06, 679.61,
]  # fmt: skip
GB200_VM_GPUS = 4

AMD_XGMI = (
    "ROCm blogs 'Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X' (2025-03-02, "
    "rocm.blogs.amd.com/software-tools-optimization/mi300x-rccl-xgmi)"
)
MI300X_ALLREDUCE_US = [  # rccl-tests all_reduce_perf out-of-place time, 8 GPUs, 1 KiB * 2^i up to 16 GiB
    13.11, 13.09, 13.27, 13.30, 13.54, 13.31, 13.77, 14.14, 16.87, 24.41, 27.42, 34.81, 51.72,
    83.68, 148.8, 244.1, 429.1, 797.4, 1537.1, 3026.2, 5970.6, 11891, 23680, 47278, 94254,
]  # fmt: skip
MI300X_A2A_BUSBW = 315.664 * G  # TransferBench a2a 64 MiB, 8 GPUs: slowest GPU's 'Actual' (7 x slowest link)
MI300X_LINK_BW = 46.552 * G  # TransferBench: average one-link GPU-to-GPU copy, 56 links
SEMIANALYSIS = (
    "SemiAnalysis 'MI300X vs H100 vs H200 Benchmark Part 1: Training' (2024-12-22) as summarised in a public "
    "survey of AI compiler stacks (code index id 71525000619): MI300X BF16 GEMM ~620, FP8 ~990 TFLOP/s"
)

NIC_EFFICIENCY = 192 / 200  # NVIDIA/nccl #812 (in #1576): 192 GB/s busbw on DGX A100, 8x200 Gb/s
NIC_ALPHA_S = 46.3e-6  # NVIDIA/nccl #1244: smallest-message time, 2 nodes x 8 GPUs, NDR InfiniBand
NIC_NOTE = (
    " x 0.96 (NVIDIA/nccl issue #812: 192 GB/s busbw on DGX A100 8x200 Gb/s); alpha 46.3 us from NVIDIA/nccl "
    "issue #1244 (2-node 16-GPU smallest-message all_reduce), half for the others"
)
STREAM_FRACTION = 2.90 / 3.35  # dgx-h100: Azure STREAM copy 2.90 TB/s of the 3.35 TB/s datasheet
STREAM_NOTE = (
    "memory_efficiency = dgx-h100's STREAM copy fraction 2.90/3.35 (Azure ND H100 v5 page): no copy "
    "figure for this GPU was found"
)
OVERLAP = "{lib} runs collectives on separate streams, concurrently with compute kernels (no SM contention modelled)"


def curve_from_sweep(peak: float, tflops: list[float]) -> tuple[float, float]:
    """(a, F_half) of the GB200 FP8 sweep against ``peak``."""
    flops = [2.0 * m * n * k for m, n, k in GEMM_SHAPES]
    times = [f / (tf * T) for f, tf in zip(flops, tflops)]
    a, half = fit_efficiency(flops=flops, time_s=times, peak_flops=[peak] * len(flops))
    for (m, n, k), f, t in zip(GEMM_SHAPES, flops, times):
        print(f"   {m}x{n}x{k}: published eff {f / t / peak:.3f}  fitted {a * f / (f + half):.3f}")
    return a, half


def same_t0(curve: Efficiency, *, peak_from: float, peak_to: float, source: str) -> Efficiency:
    """``curve`` at another peak, keeping its per-call time t0 = F_half / (a * peak)."""
    half = curve.half_saturation_flops * peak_to / peak_from
    return Efficiency(max_efficiency=curve.max_efficiency, half_saturation_flops=half, source=source)


def fitted_all_reduce(points: list[list[float]], source: str) -> CollectiveFit:
    alpha, busbw = fit_collective(kind="all_reduce", points=points)
    print(f"   all_reduce: alpha={alpha * 1e6:.1f} us busbw={busbw / G:.1f} GB/s")
    return CollectiveFit(alpha_s=alpha, busbw_bytes_per_s=busbw, source=source, points=points)


def link(name: str, all_reduce: CollectiveFit, others: dict[str, tuple[float, str]]) -> LinkSpec:
    """All five collectives: the fitted all_reduce and, per other kind, (busbw, its source) at half its alpha."""
    fits = {"all_reduce": all_reduce}
    for kind, (busbw, source) in others.items():
        fits[kind] = CollectiveFit(alpha_s=all_reduce.alpha_s / 2, busbw_bytes_per_s=busbw, source=source + HALF_ALPHA)
    return LinkSpec(name=name, collectives=fits)


def nic_link(*, nics: int, gbits: float, what: str) -> LinkSpec:
    """Inter-node: ``nics`` NICs of ``gbits`` per node x 0.96 (busbw per full node)."""
    busbw = nics * gbits / 8 * G * NIC_EFFICIENCY
    source = what + NIC_NOTE
    fits = {
        kind: CollectiveFit(
            alpha_s=NIC_ALPHA_S if kind == "all_reduce" else NIC_ALPHA_S / 2, busbw_bytes_per_s=busbw, source=source
        )
        for kind in KINDS
    }
    return LinkSpec(name=f"{nics} x {gbits:.0f} Gb/s NICs, rail-optimised, busbw per full node", collectives=fits)


# ---- Blackwell ---------------------------------------------------------------------------------------

GB200_PEAK = {"fp32": 80 * T, "tf32": 1250 * T, "bf16": 2500 * T, "fp16": 2500 * T, "fp8": 5000 * T}
GB200_PEAK_SOURCE = (
    "NVIDIA GB200 NVL72 datasheet, per GB200 superchip (2 GPUs; Tensor Core figures with sparsity, halved for "
    "dense): FP8 20, FP16/BF16 10, TF32 5 PFLOPS, FP32 160 TFLOPS (transcribed in a public wiki, code index id "
    "55599592574) -> per GPU dense FP8 5, BF16/FP16 2.5, TF32 1.25 PFLOPS, FP32 80 TFLOPS; HBM3e up to 372 GB "
    "and 16 TB/s per superchip -> 186 GB, 8 TB/s per GPU"
)
B200_PEAK = {"fp32": 75 * T, "tf32": 1100 * T, "bf16": 2250 * T, "fp16": 2250 * T, "fp8": 4500 * T}
B200_PEAK_SOURCE = (
    "NVIDIA Blackwell architecture technical brief, table 3 (HGX B200 per GPU, dense/sparse; transcribed in code "
    "index id 57514645364): FP8 4.5, FP16/BF16 2.2 (2.25 = 4.5 sparse / 2), TF32 1.1 PFLOPS, FP32 75 TFLOPS; "
    "nvidia.com/en-us/data-center/b200 HGX B200: 1.4 TB HBM3e, FP32 600 TFLOPS per 8 GPUs (code index id "
    "54597141247); 180 GB per GPU (DGX B200: 1,440 GB / 8); HBM 8 TB/s (HGX B200 table, id 19127989171)"
)
NVLINK5_DIR = 900 * G  # 1.8 TB/s NVLink 5 per GPU, both directions (HGX B200 and GB200 NVL72 tables)
SEND_RECV_FRACTION = 396.4 / 450  # stas00/ml-engineering: nvbandwidth pairwise copy on 8x H200


def blackwell_curves(peak: dict[str, float], scale_note: str) -> tuple[dict, dict]:
    """(efficiency, efficiency_by_dtype) from the GB200 sweep, at ``peak`` (t0 kept, see module docstring)."""
    print("GB200 FP8 GEMM sweep")
    a, half = curve_from_sweep(GB200_PEAK["fp8"], GB200_FP8_TFLOPS)
    sweep = AZURE_GB200.format(what=f"cuBLASLt FP8 GEMM sweep, {len(GEMM_SHAPES)} shapes")
    fitted = (
        f"; least-squares fit by profiles/sources/other_accelerators.py against the GB200 FP8 peak (F_half {half:.3g})"
    )
    fp8 = Efficiency(max_efficiency=a, half_saturation_flops=half, source=sweep + fitted + scale_note)
    fp8 = same_t0(fp8, peak_from=GB200_PEAK["fp8"], peak_to=peak["fp8"], source=fp8.source)
    bf16_source = sweep + fitted + ", rescaled to BF16 keeping t0 = F_half/(a*peak)" + scale_note
    matmul = same_t0(fp8, peak_from=peak["fp8"], peak_to=peak["bf16"], source=bf16_source)
    flash_a = GB200_FLASH_TFLOPS * T / GB200_PEAK["bf16"]
    attention = Efficiency(
        max_efficiency=flash_a,
        half_saturation_flops=matmul.half_saturation_flops,
        source=AZURE_GB200.format(what=f"Flash Attention 2.0 {GB200_FLASH_TFLOPS} TFLOPS, head dim 128, seq 8192")
        + " / GB200 BF16 peak; F_half from the matmul fit"
        + scale_note,
    )
    return {"matmul": matmul, "attention": attention}, {"fp8": {"matmul": fp8}}


def nvlink5(devices: int) -> LinkSpec:
    print("GB200 NVLink 5 all_reduce (4-GPU VM)")
    c = bus_factor(kind="all_reduce", group_size=GB200_VM_GPUS)
    sizes = [1024.0 * 2**i for i in range(len(GB200_ALLREDUCE_BUSBW_GBS))]
    points = [[GB200_VM_GPUS, s, c * s / (bw * G)] for s, bw in zip(sizes, GB200_ALLREDUCE_BUSBW_GBS)]
    source = (
        AZURE_GB200.format(what="NCCL 2.25.1 all_reduce ring busbw 1 KB..8 GB, in-place")
        + f" on one ND GB200 v6 VM ({GB200_VM_GPUS} GPUs on NVLink 5); robust fit by "
        "profiles/sources/other_accelerators.py"
        + (f"; applied to all {devices} GPUs of the NVLink domain (no larger published sweep)" if devices > 4 else "")
    )
    ar = fitted_all_reduce(points, source)
    same = "all_reduce ring busbw fit (nccl-tests PERFORMANCE.md: busbw is comparable across collectives)"
    send = (
        f"{SEND_RECV_FRACTION:.3f} x 900 GB/s per-direction NVLink 5 (the fraction stas00/ml-engineering's "
        "nvbandwidth pairwise copy reaches on H200: 396.4 of 450 GB/s)"
    )
    others = {kind: (ar.busbw_bytes_per_s, same) for kind in ("all_gather", "reduce_scatter", "all_to_all")}
    others["send_recv"] = (SEND_RECV_FRACTION * NVLINK5_DIR, send)
    name = "NVLink 5 + NVLink Switch (one 72-GPU domain)" if devices == 72 else "NVLink 5 + NVSwitch"
    return link(name, ar, others)


def gb200_nvl72() -> Profile:
    efficiency, by_dtype = blackwell_curves(GB200_PEAK, "")
    device = DeviceSpec(
        name="NVIDIA GB200 (B200 GPU of a GB200 NVL72)",
        memory_bytes=186 * 10**9,
        peak_flops=GB200_PEAK,
        memory_bandwidth_bytes_per_s=8.0e12,
        efficiency=efficiency,
        efficiency_by_dtype=by_dtype,
        memory_efficiency=STREAM_FRACTION,
        source=f"{GB200_PEAK_SOURCE}; {STREAM_NOTE}",
    )
    return Profile(
        name="gb200-nvl72",
        host=HOSTS["gb200-nvl72"],
        device=device,
        devices_per_node=72,
        intra_node=nvlink5(72),
        inter_node=nic_link(
            nics=72,
            gbits=400,
            what="72 x 400 Gb/s (one NIC per GPU, as the DGX nodes' rail-optimised fabric; assumed, not from a "
            "GB200 datasheet: replace with your racks' scale-out fabric), between NVL72 racks",
        ),
        backend="nccl",
        pricing=PricingSpec(
            on_demand_per_device_hour=42.00 / 4,
            source="api-evangelist/coreweave plans/coreweave-plans-pricing.yml (from coreweave.com/pricing, "
            f"read 2026-09-20): GB200 NVL72 $42.00/h per 4-GPU instance (row of {PRICES}, notes)",
            as_of="2026-09-20",
            instance="CoreWeave GB200 NVL72 (4-GPU instance)",
            devices_per_instance=4,
            region="North America",
        ),
        comm_overlap=CommOverlap(efficiency=1.0, source=OVERLAP.format(lib="NCCL")),
        description="GB200 NVL72 rack: 72 B200 GPUs in one NVLink 5 domain (devices_per_node 72: tp and ep groups "
        "may span its 18 compute trays), racks joined by InfiniBand; built from datasheets and published "
        "measurements by profiles/sources/other_accelerators.py.",
    )


def dgx_b200() -> Profile:
    note = "; the GB200 fit applied to HGX B200 (same Blackwell GPU; no HGX B200 GEMM sweep found), t0 kept"
    efficiency, by_dtype = blackwell_curves(B200_PEAK, note)
    device = DeviceSpec(
        name="NVIDIA B200-SXM-180GB",
        memory_bytes=180 * 10**9,
        peak_flops=B200_PEAK,
        memory_bandwidth_bytes_per_s=8.0e12,
        efficiency=efficiency,
        efficiency_by_dtype=by_dtype,
        memory_efficiency=STREAM_FRACTION,
        source=f"{B200_PEAK_SOURCE}; {STREAM_NOTE}",
    )
    return Profile(
        name="dgx-b200",
        device=device,
        devices_per_node=8,
        intra_node=nvlink5(8),
        inter_node=nic_link(
            nics=8,
            gbits=400,
            what="8x ConnectX-7 400 Gb/s InfiniBand per DGX B200 (NVIDIA DGX B200 datasheet: 4 OSFP ports serving 8 "
            "single-port ConnectX-7 VPI, up to 400 Gb/s)",
        ),
        backend="nccl",
        pricing=PricingSpec(
            on_demand_per_device_hour=6.69,
            source="api-evangelist/lambda-labs plans/lambda-labs-plans-pricing.yml (from lambda.ai/instances, read "
            f"2026-09-20): 8x NVIDIA B200 SXM6 $53.52/h, $6.69 per GPU-hour (row of {PRICES})",
            as_of="2026-09-20",
            instance="Lambda 8x NVIDIA B200 SXM6",
            devices_per_instance=8,
            region="not stated",
        ),
        comm_overlap=CommOverlap(efficiency=1.0, source=OVERLAP.format(lib="NCCL")),
        description="DGX/HGX B200 node of 8x B200 on NVLink 5 + NVSwitch, 8x 400 Gb/s InfiniBand; built from "
        "datasheets and published measurements by profiles/sources/other_accelerators.py.",
    )


# ---- AMD ---------------------------------------------------------------------------------------------

MI300X_PEAK = {"fp32": 163.4 * T, "tf32": 653.7 * T, "bf16": 1307.4 * T, "fp16": 1307.4 * T, "fp8": 2614.9 * T}
MI300X_SOURCE = (
    "AMD Instinct MI300X data sheet (amd.com amd-instinct-mi300x-data-sheet), dense: FP32 matrix 163.4, TF32 653.7, "
    "FP16/BF16 1307.4, FP8 2614.9 TFLOPS; 192 GB HBM3 at 5.3 TB/s; 7 Infinity Fabric links per GPU of 64 GB/s "
    "each way (fully connected 8-GPU node)"
)
MI300X_RATES = {"bf16": 620 * T, "fp8": 990 * T}


def mi300x_curves() -> tuple[dict, dict]:
    """a = published saturated rate / peak; F_half from dgx-h100's fitted t0 (module docstring)."""
    h100 = load_profile(Path(__file__).resolve().parents[1] / "dgx-h100.yaml").device
    curves = {}
    for dtype, rate in MI300X_RATES.items():
        ref = h100.efficiency_for("matmul", dtype)
        t0_s = ref.half_saturation_flops / (ref.max_efficiency * h100.peak_flops[dtype])
        a = rate / MI300X_PEAK[dtype]
        curves[dtype] = Efficiency(
            max_efficiency=a,
            half_saturation_flops=t0_s * a * MI300X_PEAK[dtype],
            source=f"{SEMIANALYSIS}: a = {rate / T:.0f} / {MI300X_PEAK[dtype] / T:.1f} TFLOPS; F_half keeps dgx-h100's "
            f"fitted per-call time t0 = {t0_s * 1e6:.2f} us (no MI300X GEMM sweep found)",
        )
        print(f"MI300X {dtype}: a={a:.3f} F_half={curves[dtype].half_saturation_flops:.3g}")
    return {"matmul": curves["bf16"]}, {"fp8": {"matmul": curves["fp8"]}}


def xgmi() -> LinkSpec:
    print("MI300X xGMI all_reduce (8 GPUs)")
    sizes = [1024.0 * 2**i for i in range(len(MI300X_ALLREDUCE_US))]
    points = [[8, s, t * 1e-6] for s, t in zip(sizes, MI300X_ALLREDUCE_US)]
    source = (
        f"{AMD_XGMI}: rccl-tests all_reduce_perf out-of-place, 8 GPUs, 1 KB..16 GB (RCCL 2.22.3, ROCm 6.3); "
        "robust fit by profiles/sources/other_accelerators.py"
    )
    ar = fitted_all_reduce(points, source)
    same = "all_reduce busbw fit (nccl-tests PERFORMANCE.md: busbw is comparable across collectives)"
    others = {kind: (ar.busbw_bytes_per_s, same) for kind in ("all_gather", "reduce_scatter")}
    others["all_to_all"] = (
        MI300X_A2A_BUSBW,
        f"{AMD_XGMI}: TransferBench a2a, 64 MiB per pair, 8 GPUs: 315.7 GB/s per GPU over its 7 links (slowest GPU)",
    )
    others["send_recv"] = (MI300X_LINK_BW, f"{AMD_XGMI}: TransferBench, one xGMI link GPU to GPU, 46.6 GB/s average")
    return link("Infinity Fabric (xGMI), fully connected", ar, others)


def mi300x() -> Profile:
    efficiency, by_dtype = mi300x_curves()
    device = DeviceSpec(
        name="AMD Instinct MI300X",
        memory_bytes=192 * 2**30,
        peak_flops=MI300X_PEAK,
        memory_bandwidth_bytes_per_s=5.3e12,
        efficiency=efficiency,
        efficiency_by_dtype=by_dtype,
        memory_efficiency=STREAM_FRACTION,
        source=f"{MI300X_SOURCE}; {STREAM_NOTE}; no published MI300X attention (forward + backward) rate was found: "
        "attention is priced on the matmul curve",
    )
    return Profile(
        name="mi300x",
        device=device,
        devices_per_node=8,
        intra_node=xgmi(),
        inter_node=nic_link(
            nics=8,
            gbits=400,
            what="8x 400 Gb/s RoCE/InfiniBand NICs per MI300X node, one per GPU (AMD Instinct MI300X platform); "
            "the NVIDIA figures below, no RCCL inter-node measurement was found",
        ),
        backend="nccl",
        comm_overlap=CommOverlap(efficiency=1.0, source=OVERLAP.format(lib="RCCL (torch's 'nccl' backend on ROCm)")),
        description="AMD Instinct MI300X platform: 8 GPUs fully connected by Infinity Fabric, RCCL, 8x 400 Gb/s "
        "NICs; built from datasheets and published measurements by profiles/sources/other_accelerators.py.",
    )


def main() -> None:
    out = Path(__file__).resolve().parents[1]
    for build in (mi300x, dgx_b200, gb200_nvl72):
        profile = build()
        print(f"wrote {save_profile(profile, out / f'{profile.name}.yaml')}")


if __name__ == "__main__":
    main()
