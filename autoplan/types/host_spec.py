"""The host a device offloads to: ``Profile.host`` (optional; docs/profile-format.md, "The host section").

Three figures, each with its source, all per device (a node's host memory and cores are shared by
its devices): the host memory a device's offloaded states may use, the host<->device link's bytes
per second in one direction (PCIe Gen4/Gen5 x16, or Grace-Hopper's NVLink-C2C), and how many
parameters per second the host's CPU Adam steps with that device's share of the cores (DeepSpeed's
CPU-Adam, Ren et al., "ZeRO-Offload", USENIX ATC'21, section 4.1). A profile without this section
prices no offload (autoplan/cost/memory/offload.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.types.reliability import _number, _text


@dataclass
class HostProfile:
    """Host memory per device (bytes), host<->device bytes per second per direction, CPU Adam
    parameters per second per device, and where each figure comes from."""

    host_memory_bytes_per_device: float
    link_bytes_per_s: float
    adam_params_per_s: float
    source: str
    link_source: str
    adam_source: str

    def check(self) -> None:
        _number("host", "host_memory_bytes_per_device", self.host_memory_bytes_per_device)
        _number("host", "link_bytes_per_s", self.link_bytes_per_s)
        _number("host", "adam_params_per_s", self.adam_params_per_s)
        for name in ("source", "link_source", "adam_source"):
            _text("host", name, getattr(self, name))
