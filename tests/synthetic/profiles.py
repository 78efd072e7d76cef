"""Synthetic cluster profiles: an A100-SXM4-80GB node (NVIDIA A100 datasheet: 312 TFLOP/s bf16,
19.5 TFLOP/s fp32, 2.0 TB/s HBM2e) with NVLink/InfiniBand bus bandwidths in the range nccl-tests
reports; illustrative defaults for tests, not a calibrated profile (use profiles/*.yaml for that).
"""

from __future__ import annotations

from autoplan.types.host_spec import HostProfile
from autoplan.types.pricing import PricingSpec
from autoplan.types.profile import COLLECTIVES, CollectiveFit, DeviceSpec, Efficiency, LinkSpec, Profile

_SOURCE = "synthetic test profile (A100-SXM4-80GB datasheet figures; not calibrated)"


def synthetic_profile(
    *,
    devices_per_node: int = 8,
    memory_bytes: int = 80 * 2**30,
    intra_busbw_bytes_per_s: float = 230e9,
    inter_busbw_bytes_per_s: float = 23e9,
    name: str = "synthetic-a100",
) -> Profile:
    """An A100-like node profile whose memory and link speeds can be changed for tests."""

    def link(link_name: str, busbw: float, alpha_s: float) -> LinkSpec:
        return LinkSpec(
            name=link_name,
            collectives={
                k: CollectiveFit(alpha_s=alpha_s, busbw_bytes_per_s=busbw, source=_SOURCE) for k in COLLECTIVES
            },
        )

    eff = {
        c: Efficiency(max_efficiency=0.8, half_saturation_flops=2e9, source=_SOURCE) for c in ("matmul", "attention")
    }
    device = DeviceSpec(
        name="A100-SXM4-80GB",
        memory_bytes=memory_bytes,
        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
        memory_bandwidth_bytes_per_s=2.0e12,
        efficiency=eff,
        source=_SOURCE,
    )
    return Profile(
        name=name,
        device=device,
        devices_per_node=devices_per_node,
        intra_node=link("nvlink", intra_busbw_bytes_per_s, 10e-6),
        inter_node=link("infiniband", inter_busbw_bytes_per_s, 20e-6),
        pricing=PricingSpec(on_demand_per_device_hour=2.0, source=_SOURCE),
    )


def _link(name, busbw, alpha_s):
    return LinkSpec(
        name=name,
        collectives={
            kind: CollectiveFit(alpha_s=alpha_s, busbw_bytes_per_s=busbw, source="test") for kind in COLLECTIVES
        },
    )


def a100_profile(*, inter_busbw=200e9, intra_busbw=230e9, price=None) -> Profile:
    """A DGX-A100-like profile (hardware.csv): 312 TFLOP/s bf16, 80 GB, NVLink, 8x HDR."""
    device = DeviceSpec(
        name="A100-SXM4-80GB",
        memory_bytes=80 * 2**30,
        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
        memory_bandwidth_bytes_per_s=2.039e12,
        efficiency={
            "matmul": Efficiency(max_efficiency=0.8, half_saturation_flops=2e9, source="test"),
            "attention": Efficiency(max_efficiency=0.6, half_saturation_flops=2e9, source="test"),
        },
        source="test",
    )
    return Profile(
        name="test-a100",
        device=device,
        devices_per_node=8,
        intra_node=_link("nvlink", intra_busbw, 10e-6),
        inter_node=_link("ib", inter_busbw, 20e-6),
        pricing=PricingSpec(on_demand_per_device_hour=price, source="test") if price is not None else None,
    )


def rental_profile(
    *,
    name: str,
    price: float,
    inter_busbw_bytes_per_s: float = 23e9,
    flops_scale: float = 1.0,
    spot_price: float | None = None,
    spot_interruptions: float | None = None,
    failures_per_device_hour: float | None = None,
    instance: str = "",
) -> Profile:
    """A priced 8-device instance for cluster sweeps (solve/cluster.py): ``synthetic_profile`` with its
    inter-node bandwidth, its compute scaled by ``flops_scale``, a price, optionally a spot price and
    interruption rate, and with ``failures_per_device_hour`` storage and reliability sections."""
    from dataclasses import replace

    from autoplan.types.reliability import ReliabilitySpec, StorageSpec

    base = synthetic_profile(name=name, inter_busbw_bytes_per_s=inter_busbw_bytes_per_s)
    device = replace(base.device, peak_flops={k: v * flops_scale for k, v in base.device.peak_flops.items()})
    pricing = PricingSpec(
        on_demand_per_device_hour=price,
        source=_SOURCE,
        instance=instance or f"{name}.8x",
        devices_per_instance=8,
        spot_per_device_hour=spot_price,
        spot_source=_SOURCE if spot_price is not None else None,
        spot_interruptions_per_device_hour=spot_interruptions,
        spot_interruption_source=_SOURCE if spot_interruptions is not None else None,
    )
    reliable = failures_per_device_hour is not None
    return replace(
        base,
        device=device,
        pricing=pricing,
        storage=StorageSpec(write_bytes_per_s_per_device=1e9, read_bytes_per_s_per_device=1e9, source=_SOURCE)
        if reliable
        else None,
        reliability=ReliabilitySpec(
            failures_per_device_hour=failures_per_device_hour, restart_s=600.0, source=_SOURCE, restart_source=_SOURCE
        )
        if reliable
        else None,
    )


def synthetic_host() -> HostProfile:
    """A host section for offload tests: 64 GiB per device, a 25 GB/s link, 1e9 Adam params/s."""
    return HostProfile(
        host_memory_bytes_per_device=64 * 2**30,
        link_bytes_per_s=25e9,
        adam_params_per_s=1e9,
        source="test host",
        link_source="test link",
        adam_source="test adam",
    )
