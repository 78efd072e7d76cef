"""Build the cloud-instance profiles (profiles/aws-*.yaml, gcp-a3-high.yaml, azure-nd-h100-v5.yaml).

Run:  python profiles/sources/instances.py   (prints each fit, rewrites the seven files)

An instance profile is its DGX profile (profiles/sources/fit_published.py: device, efficiency
curves, NVSwitch intra-node link, storage and reliability) with what differs on the rental:

* device memory (and HBM bandwidth) where the instance's GPU differs: p4d has A100-SXM4-40GB
  (40 GB, 1,555 GB/s; NVIDIA A100 datasheet, as tabulated in ../shared/reference/hardware.csv);
* inter-node link: the NIC line rate times a measured efficiency. Where a published nccl-tests
  all_reduce sweep across 2 instances exists (aws-samples/awsome-distributed-training
  micro-benchmarks/nccl-tests/README.md: 2x p4de.24xlarge, 8 B .. 2 GiB; 2x p5.48xlarge,
  8 B .. 16 GiB), it is fitted as t = alpha + S / B (robust soft-L1, autoplan.profile.fit). On
  2 nodes NCCL's tree all_reduce moves S bytes per node each way, so B (the algbw asymptote)
  is the per-node throughput, which is what a many-node ring reaches and what
  ``inter_node.busbw`` means (docs/profile-format.md; 2-node busbw = 2(n-1)/n x B overstates
  it: NVIDIA/nccl-tests issue #169). Elsewhere: line rate x 0.96, the DGX profiles' factor (NVIDIA/nccl
  #812), said so in the source;
* ``pricing``: on-demand (and spot, where listed) per GPU-hour from
  ../shared/reference/gpu_prices.csv, each with its row's source, date and region.

V100 (aws-p3) has no DGX profile: its device is built from the NVIDIA V100 datasheet, its
efficiency curves are the A100 fit's, rescaled to the V100 peak keeping the per-call time
t0 = F_half / (a * peak) fixed (fit_published.py explains why), and its intra-node link is
the NVLink2 hybrid cube mesh estimated from the A100 node's measured fraction of line rate.
No spot interruption rate is set: no AWS Spot Instance Advisor band for these instance types
was found in the sources at hand, and GCP publishes none.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoplan.profile import load_profile  # noqa: E402
from autoplan.profile.fit import fit_affine  # noqa: E402
from autoplan.profile.io import save_profile  # noqa: E402
from autoplan.types.pricing import PricingSpec  # noqa: E402
from autoplan.types.profile import CollectiveFit, DeviceSpec, Efficiency, LinkSpec, Profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_figures import HOSTS  # noqa: E402

T, G = 1e12, 1e9
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
HALF_ALPHA = "; alpha of the others = all_reduce alpha / 2 (Thakur et al. 2005: (n-1) vs 2(n-1) latency steps)"
DGX_EFFICIENCY = 192 / 200  # NVIDIA/nccl #812 (in #1576): 192 GB/s busbw on DGX A100, 8x200 Gb/s
DGX_ALPHA_S = 46.3e-6  # NVIDIA/nccl #1244: smallest-message time, 2 nodes x 8 GPUs, NDR InfiniBand

AWSOME = "aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md"
# nccl-tests all_reduce_perf on 2 instances x 8 GPUs: (source, line rate, in-place times in us at sizes 8 B * 2^i)
SWEEPS = {
    "p4de": (
        f"{AWSOME} (2x p4de.24xlarge, 8 B .. 2 GiB, all_reduce_perf in-place)",
        400 / 8 * G,
        [163.3, 160.6, 160.9, 160.6, 161.2, 161.5, 161.5, 164.8, 178.5, 170.0, 175.7, 192.5, 223.7, 225.5, 226.8]
        + [235.5, 259.9, 307.3, 397.4, 530.3, 760.7, 1190.4, 1540.7, 2647.2, 3932.8, 7227.9, 13548, 26194, 51406],
    ),
    "p5": (
        f"{AWSOME} (2x p5.48xlarge, 8 B .. 16 GiB, all_reduce_perf in-place)",
        3200 / 8 * G,
        [72.43, 73.91, 64.75, 74.40, 65.43, 65.70, 66.88, 69.04, 71.29, 78.55, 80.47, 82.35, 89.75, 103.8, 96.55]
        + [104.7, 113.3, 121.3, 147.1, 167.7, 201.1, 298.3, 417.7, 604.2, 876.8, 1452.7, 2554.9, 4565.6, 9108.5]
        + [17343, 33628, 66109],
    ),
}

PRICES = "../shared/reference/gpu_prices.csv"
VANTAGE = (
    "tsaol/aws-gpu data/{file} (auto-generated from instances.vantage.sh, 'Last updated: 2026-01-21', git 7412fd2)"
)
GCP_BILLING = (
    "Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml (generated 2025-03-06 from the GCP Cloud Billing "
    "SKU API, commit 0166a59)"
)


def aws_price(instance: str, per_instance: float, file: str, note: str = "") -> PricingSpec:
    return PricingSpec(
        on_demand_per_device_hour=per_instance / 8,
        source=f"{VANTAGE.format(file=file)}: ${per_instance}/h per {instance}, Linux on-demand / 8 GPUs"
        + note
        + f" (row of {PRICES})",
        as_of="2026-01-21",
        instance=instance,
        devices_per_instance=8,
        region="us-east-1",
    )


INSTANCES = {
    "aws-p4d": dict(
        base="dgx-a100",
        device="NVIDIA A100-SXM4-40GB",
        memory=(40 * 2**30, 1.555e12, "A100 40GB SXM: 40 GB HBM2, 1,555 GB/s (NVIDIA A100 datasheet; hardware.csv)"),
        network="400 Gbps EFA (4 x 100 Gbps)",
        nic_bytes_per_s=400 / 8 * G,
        sweep="p4de",
        sweep_note="p4de has the same NICs, NVSwitch and host as p4d (AWS P4 instance page)",
        pricing=aws_price(
            "p4d.24xlarge",
            21.957642,
            "p4d_instances.js",
            "; after AWS's 2025-06-01 cut of 33% (AWS News Blog, 2025-06-05)",
        ),
    ),
    "aws-p4de": dict(
        base="dgx-a100",
        network="400 Gbps EFA (4 x 100 Gbps)",
        nic_bytes_per_s=400 / 8 * G,
        sweep="p4de",
        pricing=aws_price(
            "p4de.24xlarge",
            27.44705,
            "p4de_instances.js",
            "; after AWS's 2025-06-01 cut of 33% (AWS News Blog, 2025-06-05)",
        ),
    ),
    "aws-p5": dict(
        base="dgx-h100",
        network="3200 Gbps EFAv2 (32 x 100 Gbps)",
        nic_bytes_per_s=3200 / 8 * G,
        sweep="p5",
        pricing=aws_price(
            "p5.48xlarge",
            55.04,
            "p5_instances.js",
            "; after AWS's 2025-06-01 cut of 44% (AWS News Blog, 2025-06-05; was $98.32)",
        ),
    ),
    "aws-p5en": dict(
        base="dgx-h200",
        network="3200 Gbps EFAv3 (16 x 200 Gbps)",
        nic_bytes_per_s=3200 / 8 * G,
        sweep="p5",
        sweep_note="no published p5en sweep was found; the p5 sweep's efficiency (same 3200 Gbps EFA and "
        "aws-ofi-nccl stack, one EFA generation older) is applied to the p5en line rate",
        pricing=aws_price(
            "p5en.48xlarge",
            63.296,
            "p5en_instances.js",
            "; after AWS's 2025-06-01 cut of 25% (AWS News Blog, 2025-06-05)",
        ),
    ),
    "gcp-a3-high": dict(
        base="dgx-h100",
        network="800 Gbps GPUDirect-TCPX (4 x 200 Gbps GPU NICs)",
        nic_bytes_per_s=800 / 8 * G,
        nic_source="GCP 'Networking and GPU machines' (cloud.google.com/compute/docs/gpus/gpu-network-bandwidth): "
        "A3 High up to 1,000 Gbps in all, GPUDirect-TCPX; 4 GPU NICs of 200 Gbps (the fifth, 200 Gbps, is the "
        "host's gVNIC; GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpx/nccl-test.yaml attaches "
        "eth1..eth4 for GPU traffic, gpudirect-tcpxo attaches eth1..eth8 on A3 Mega). No published TCPX "
        "nccl-tests figure was found: line rate x 0.96 (the DGX profiles' factor, NVIDIA/nccl #812), likely "
        "optimistic for a TCP-based transport; alpha 46.3 us, the DGX profiles' InfiniBand figure "
        "(NVIDIA/nccl #1244), likewise optimistic",
        pricing=PricingSpec(
            on_demand_per_device_hour=88.49 / 8,
            source=f"{GCP_BILLING}: a3-highgpu-8g 'hour' $88.49 (VM incl. 208 vCPU, 1,872 GB, 6,000 GiB SSD) / 8 "
            f"GPUs; same in us-east1/us-west1 (row of {PRICES})",
            as_of="2025-03-06",
            instance="a3-highgpu-8g",
            devices_per_instance=8,
            region="us-central1",
            spot_per_device_hour=35.3957 / 8,
            spot_source=f"{GCP_BILLING}: a3-highgpu-8g 'hour_spot' $35.3957 / 8 GPUs; GCP spot prices can change "
            f"daily (row of {PRICES})",
        ),
    ),
    "azure-nd-h100-v5": dict(
        base="dgx-h100",
        network="3.2 Tbps NDR InfiniBand (8 x 400 Gb/s ConnectX-7)",
        nic_bytes_per_s=3200 / 8 * G,
        nic_source="Azure ND H100 v5 docs: '3.2 Tbps of interconnect bandwidth per VM', one 400 Gb/s Quantum-2 "
        "ConnectX-7 InfiniBand link per GPU (as DGX H100) x 0.96 (NVIDIA/nccl #812); alpha 46.3 us from "
        "NVIDIA/nccl #1244 (2-node 16-GPU smallest-message all_reduce, NDR): the dgx-h100 inter-node link",
        pricing=PricingSpec(
            on_demand_per_device_hour=12.29,
            source="datareceipts/data-receipts 109-gpu-pricing (README.md result table and compare.json, "
            f"'retrieved': '2026-11-09'): Standard_ND96isr_H100_v5 $12.29 per GPU-hour (row of {PRICES}; "
            "region eastus assumed, as the file's other Azure rows)",
            as_of="2026-11-09",
            instance="Standard_ND96isr_H100_v5",
            devices_per_instance=8,
            region="eastus",
        ),
    ),
}


def fit_sweep(key: str) -> tuple[float, float, str]:
    """(alpha_s, achieved fraction of line rate, source) of t = alpha + S / B on a published 2-instance sweep."""
    source, line, times_us = SWEEPS[key]
    sizes = [8.0 * 2**i for i in range(len(times_us))]
    alpha, slope = fit_affine(x=sizes, t=[t * 1e-6 for t in times_us])
    per_node = 1.0 / slope
    print(f"{key} sweep: alpha={alpha * 1e6:.1f} us, B={per_node / G:.1f} GB/s per node = {per_node / line:.3f} x line")
    source += (
        f": B = {per_node / G:.1f} GB/s of {line / G:.0f} GB/s line rate (2-node tree all_reduce moves S per node "
        "each way, so B is the per-node throughput a many-node ring's busbw approaches; the sweep's own 2-node "
        "busbw is 2(n-1)/n x B)"
    )
    return alpha, per_node / line, source


def inter_link(spec: dict) -> LinkSpec:
    line = spec["nic_bytes_per_s"]
    if "sweep" in spec:
        alpha, efficiency, sweep_source = fit_sweep(spec["sweep"])
        busbw = efficiency * line
        source = (
            f"{spec['network']}: line rate {line / G:.0f} GB/s per instance x {efficiency:.3f}, the achieved "
            f"fraction of t = alpha + S/B fitted by profiles/sources/instances.py to {sweep_source}; alpha "
            f"{alpha * 1e6:.1f} us from the same fit (EFA latency; the InfiniBand DGX profiles: 46.3 us)"
            + (f"; {spec['sweep_note']}" if "sweep_note" in spec else "")
        )
    else:
        alpha, busbw = DGX_ALPHA_S, line * DGX_EFFICIENCY
        source = f"{spec['network']}: {spec['nic_source']}"
    fits = {
        kind: CollectiveFit(
            alpha_s=alpha if kind == "all_reduce" else alpha / 2, busbw_bytes_per_s=busbw, source=source + HALF_ALPHA
        )
        for kind in KINDS
    }
    return LinkSpec(name=f"{spec['network']}, busbw per full node", collectives=fits)


def carried(section, base: str):
    """A DGX profile's storage or reliability section, its source saying where it came from."""
    if section is None:
        return None
    section = copy.deepcopy(section)
    section.source = f"carried over from {base} (not this cloud's own figure; replace with yours): " + section.source
    return section


def build(name: str, spec: dict) -> Profile:
    base = load_profile(spec["base"])
    device = copy.deepcopy(base.device)
    if "device" in spec:
        memory_bytes, hbm, memory_source = spec["memory"]
        device.name, device.memory_bytes, device.memory_bandwidth_bytes_per_s = spec["device"], memory_bytes, hbm
        device.source = f"{memory_source}; otherwise {base.name}: {device.source}"
    instance = spec["pricing"].instance
    return Profile(
        name=name,
        device=device,
        devices_per_node=8,
        intra_node=copy.deepcopy(base.intra_node),
        inter_node=inter_link(spec),
        backend="nccl",
        pricing=spec["pricing"],
        description=f"{instance}: 8x {device.name}, NVLink + NVSwitch, {spec['network']}; {base.name}'s device "
        "and intra-node link with the rental's network and price, built by profiles/sources/instances.py.",
        storage=carried(base.storage, base.name),
        reliability=carried(base.reliability, base.name),
    )


V100_SOURCE = (
    "NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOPS FP16 tensor, 15.7 TFLOPS FP32, no BF16 or TF32; 16 GB HBM2 at "
    "900 GB/s; NVLink 300 GB/s (6 NVLink2 links of 25 GB/s per direction)"
)
V100_NVLINK_DIR = 6 * 25 * G  # per GPU, per direction: 6 NVLink2 links (V100 datasheet; DGX-1 hybrid cube mesh)
P3 = dict(
    network="25 Gbps Ethernet (TCP sockets, no EFA)",
    nic_bytes_per_s=25 / 8 * G,
    nic_source="AWS p3.16xlarge network '25 Gigabit', no EFA (tsaol/aws-gpu data/p3_instances.js; Alpa OSDI'22 "
    "ran 8x p3.16xlarge at 25 Gbps). No published p3.16xlarge nccl-tests figure was found: line rate x 0.96 (the "
    "DGX profiles' factor, NVIDIA/nccl #812; optimistic for NCCL's socket transport); alpha 163 us, the "
    "smallest-message 2-node all_reduce time on p3dn.24xlarge with EFA "
    "(gist.github.com/jacobkahn/a92f4425abf831ac0799fabe9079263d, 2019-07, "
    "'NCCL Tests on 2 node p3dn.24xlarge + EFA'), a lower bound for TCP without EFA",
    alpha_s=163e-6,
)


def v100_device(a100: DeviceSpec) -> DeviceSpec:
    """V100-SXM2-16GB: datasheet peaks; A100 efficiency curves at the same per-call time t0."""
    scale = 125 * T / a100.peak_flops["fp16"]  # F_half scales with the peak: t0 = F_half/(a*peak) is kept

    def rescaled(eff: Efficiency, what: str) -> Efficiency:
        return Efficiency(
            max_efficiency=eff.max_efficiency,
            half_saturation_flops=eff.half_saturation_flops * scale,
            source=f"NOT a V100 measurement (no published V100 sweep at hand): the dgx-a100 {what} fit "
            f"(a = {eff.max_efficiency:.3f}), F_half x 125/312 so that t0 = F_half/(a*peak) stays "
            f"{eff.half_saturation_flops / (eff.max_efficiency * a100.peak_flops['fp16']) * 1e6:.1f} us"
            + (
                "; Flash-Attention 2 does not run on Volta, so attention is likely slower"
                if what == "attention"
                else ""
            )
            + f". Original: {eff.source}",
        )

    return DeviceSpec(
        name="Tesla V100-SXM2-16GB",
        memory_bytes=16 * 2**30,
        peak_flops={"fp32": 15.7 * T, "fp16": 125 * T},
        memory_bandwidth_bytes_per_s=900 * G,
        efficiency={kind: rescaled(eff, kind) for kind, eff in a100.efficiency.items()},
        memory_efficiency=a100.memory_efficiency,
        source=f"{V100_SOURCE}; memory_efficiency = dgx-a100's STREAM-copy/datasheet ratio "
        f"({a100.memory_efficiency:.3f}; no V100 STREAM figure at hand)",
    )


def v100_intra(a100: Profile) -> LinkSpec:
    """NVLink2 hybrid cube mesh: busbw = per-direction NVLink x the A100 node's measured fraction of its own."""
    ar = a100.intra_node.collectives["all_reduce"]
    fraction = ar.busbw_bytes_per_s / (300 * G)
    busbw = fraction * V100_NVLINK_DIR
    print(f"p3 intra: busbw {busbw / G:.1f} GB/s = {fraction:.3f} x {V100_NVLINK_DIR / G:.0f} GB/s")
    source = (
        f"ESTIMATE, no published p3/DGX-1 sweep at hand: {V100_NVLINK_DIR / G:.0f} GB/s per-direction NVLink2 per "
        f"GPU (6 x 25 GB/s, hybrid cube mesh: GPU pairs have 2, 1 or no direct links, so rings share links) x "
        f"{fraction:.3f}, the dgx-a100 fitted all_reduce busbw ({ar.busbw_bytes_per_s / G:.1f} GB/s) over its "
        f"300 GB/s; alpha = dgx-a100's fitted all_reduce alpha ({ar.alpha_s * 1e6:.1f} us)"
    )
    fits = {
        kind: CollectiveFit(
            alpha_s=ar.alpha_s if kind == "all_reduce" else ar.alpha_s / 2,
            busbw_bytes_per_s=busbw,
            source=source + HALF_ALPHA,
        )
        for kind in KINDS[:-1]
    }
    send_recv = 396.4 / 450 * 25 * G  # one NVLink2 link, at the nvbandwidth fraction fit_published.py uses
    fits["send_recv"] = CollectiveFit(
        alpha_s=ar.alpha_s / 2,
        busbw_bytes_per_s=send_recv,
        source="one NVLink2 link (25 GB/s per direction; most hybrid-cube-mesh neighbours have one) x 0.881 "
        "(stas00/ml-engineering nvbandwidth on H200: 396.4 of 450 GB/s)" + HALF_ALPHA,
    )
    return LinkSpec(name="NVLink2 hybrid cube mesh (no NVSwitch)", collectives=fits)


def build_p3() -> Profile:
    a100 = load_profile("dgx-a100")
    link = inter_link(P3)
    for kind, fit in link.collectives.items():
        fit.alpha_s = P3["alpha_s"] if kind == "all_reduce" else P3["alpha_s"] / 2
    return Profile(
        name="aws-p3",
        host=HOSTS["aws-p3"],
        device=v100_device(a100.device),
        devices_per_node=8,
        intra_node=v100_intra(a100),
        inter_node=link,
        backend="nccl",
        pricing=aws_price(
            "p3.16xlarge",
            24.48,
            "p3_instances.js",
            "; long-standing list price (the same $24.48 in 'GPU Pricing Reference Data, January 2025')",
        ),
        description="p3.16xlarge: 8x Tesla V100-SXM2-16GB, NVLink2 hybrid cube mesh, 25 Gbps Ethernet; V100 "
        "datasheet with the A100 fit's curves (no bf16), built by profiles/sources/instances.py.",
    )


def main() -> None:
    out = Path(__file__).resolve().parents[1]
    profiles = [build(name, spec) for name, spec in INSTANCES.items()] + [build_p3()]
    for profile in profiles:
        print(f"wrote {save_profile(profile, out / f'{profile.name}.yaml')}")


if __name__ == "__main__":
    main()
