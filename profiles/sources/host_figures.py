"""The ``host:`` section of the shipped GPU profiles (docs/profile-format.md, "host"), from datasheets.

Read by the builders (fit_published.py, instances.py, other_accelerators.py), which write it into each
profile named below.

Per device, three figures:

* host memory: the node's system memory (datasheet) over its GPUs;
* link: the host<->device bandwidth per direction. PCIe: the x16 line rate times 0.88, the fraction of
  PCIe5 x16 that nvbandwidth measures on H200 (55.06 GB/s D2H, stas00/ml-engineering), as the storage
  section's staging figure does; Grace's NVLink-C2C: 900 GB/s both directions per superchip;
* CPU Adam: the step is memory bound, 28 bytes per parameter (read weight, gradient, two moments; write
  weight and two moments, fp32: autoplan/cost/model.py ADAM_BYTES_PER_PARAM), so parameters per second =
  the device's share of the host's DRAM peak bandwidth (channels x transfer rate x 8 bytes) / 28. DeepSpeed's
  CPU-Adam is AVX-vectorised and bound by memory (Ren et al., "ZeRO-Offload", USENIX ATC'21, section 4.1);
  a peak, not a STREAM measurement: replace it with `autoplan profile`'s on your hosts.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autoplan.types.host_spec import HostProfile  # noqa: E402

PCIE_MEASURED_FRACTION = 55.06 / 63.0  # nvbandwidth D2H on H200 / PCIe5 x16 line rate per direction
ADAM_BYTES = 28


def _ddr_adam(*, sockets: int, channels: int, mt_s: float, devices: int) -> float:
    """CPU Adam parameters per second per device: sockets x channels x MT/s x 8 bytes / devices / 28."""
    return sockets * channels * mt_s * 1e6 * 8 / devices / ADAM_BYTES


def _pcie(line_bytes_per_s: float) -> float:
    return line_bytes_per_s * PCIE_MEASURED_FRACTION


PCIE5_SOURCE = "PCIe Gen5 x16 D2H 55.06 GB/s measured with nvbandwidth on H200 (stas00/ml-engineering)"
SPR = "2x Intel Xeon Platinum 8480C, 8 channels of DDR5-4800 each (Intel ARK): 614 GB/s peak over 8 GPUs, / 28 B"
HOSTS = {
    "dgx-a100": HostProfile(
        host_memory_bytes_per_device=2e12 / 8,
        link_bytes_per_s=_pcie(31.5e9),
        adam_params_per_s=_ddr_adam(sockets=2, channels=8, mt_s=3200, devices=8),
        source="NVIDIA DGX A100 datasheet (640 GB system): 2 TB system memory over 8 GPUs",
        link_source="PCIe Gen4 x16, 31.5 GB/s per direction (A100 datasheet) x 0.88 (the measured fraction of "
        "PCIe5 x16 on H200, stas00/ml-engineering)",
        adam_source="2x AMD EPYC 7742, 8 channels of DDR4-3200 each (AMD datasheet): 410 GB/s peak over 8 GPUs, "
        "/ 28 B per Adam parameter (module docstring of profiles/sources/host_figures.py)",
    ),
    "dgx-h100": HostProfile(
        host_memory_bytes_per_device=2e12 / 8,
        link_bytes_per_s=55.06e9,
        adam_params_per_s=_ddr_adam(sockets=2, channels=8, mt_s=4800, devices=8),
        source="NVIDIA DGX H100 datasheet: 2 TB system memory over 8 GPUs",
        link_source=PCIE5_SOURCE,
        adam_source=SPR + " per Adam parameter (profiles/sources/host_figures.py)",
    ),
    "dgx-h200": HostProfile(
        host_memory_bytes_per_device=2e12 / 8,
        link_bytes_per_s=55.06e9,
        adam_params_per_s=_ddr_adam(sockets=2, channels=8, mt_s=4800, devices=8),
        source="NVIDIA DGX H200 datasheet: 2 TB system memory over 8 GPUs",
        link_source=PCIE5_SOURCE,
        adam_source=SPR + " per Adam parameter (profiles/sources/host_figures.py)",
    ),
    "gb200-nvl72": HostProfile(
        host_memory_bytes_per_device=480e9 / 2,
        link_bytes_per_s=450e9 / 2,
        adam_params_per_s=512e9 / 2 / ADAM_BYTES,
        source="NVIDIA GB200 NVL72 datasheet: one Grace CPU with up to 480 GB LPDDR5X per superchip of 2 B200 GPUs",
        link_source="NVLink-C2C 900 GB/s bidirectional per GB200 superchip (datasheet): 450 GB/s per direction, "
        "shared by its 2 GPUs",
        adam_source="Grace LPDDR5X up to 512 GB/s per superchip (datasheet) over 2 GPUs, / 28 B per Adam parameter "
        "(profiles/sources/host_figures.py)",
    ),
    "aws-p3": HostProfile(
        host_memory_bytes_per_device=488 * 2**30 / 8,
        link_bytes_per_s=_pcie(15.75e9),
        adam_params_per_s=_ddr_adam(sockets=2, channels=4, mt_s=2400, devices=8),
        source="AWS p3.16xlarge: 488 GiB memory over 8 V100 (tsaol/aws-gpu data/p3_instances.js)",
        link_source="PCIe Gen3 x16, 15.75 GB/s per direction x 0.88 (the measured fraction of PCIe5 x16 on H200, "
        "stas00/ml-engineering)",
        adam_source="2x Intel Xeon E5-2686 v4, 4 channels of DDR4-2400 each (Intel ARK): 154 GB/s peak over 8 GPUs, "
        "/ 28 B per Adam parameter (profiles/sources/host_figures.py)",
    ),
}
