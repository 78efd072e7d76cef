"""Does a profile describe the machine it is used on? (docs/profile-format.md, "Fields", ``device.name``)

A profile belongs to the machine it was measured on: its ``device.name`` is the CPU model
(``autoplan profile`` writes "<model> (<threads> threads)") or the GPU name. A CPU profile
prices runs on this very machine, so a different CPU model here is worth one line: a profile
measured on an Intel Xeon predicted an AMD EPYC 4-5x too fast (issue 13). A GPU profile
describes a cluster that planning need not have: ``plan`` compares it only when this machine
has a GPU; ``run`` always does, since that is where the plan runs.
"""

from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

from autoplan.types.profile import Profile

#: |measured / predicted - 1| beyond which ``autoplan run`` suggests re-profiling or calibrating.
MISMATCH_RATIO = 0.25


def cpu_model() -> str:
    """This machine's CPU model, as /proc/cpuinfo (else the platform) names it: what
    ``autoplan profile`` records in ``device.name`` and what it is compared with."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _bare(name: str) -> str:
    """A device name without the thread count ``autoplan profile`` appends: the hardware's name."""
    return " ".join(re.sub(r"\(\d+ threads\)", "", name).split())


#: Words that name a GPU's form factor in CUDA's device names ("NVIDIA H100 PCIe", "NVIDIA H200 NVL");
#: the SXM parts carry none of them ("NVIDIA H100 80GB HBM3", "NVIDIA H200").
_GPU_VARIANTS = {"pcie", "nvl"}


def same_device(a: str, b: str) -> bool:
    """Do two device names name the same hardware? CPUs: the same model string. GPUs: the same model
    (H200, A100, ...) and form factor, however a datasheet profile spells the rest ("NVIDIA
    H200-SXM-141GB" is what CUDA calls "NVIDIA H200")."""
    if _bare(a).lower() == _bare(b).lower():
        return True
    words_a, words_b = (set(re.split(r"[\s\-_]+", _bare(n).lower())) for n in (a, b))
    if "nvidia" not in words_a or "nvidia" not in words_b:
        return False
    models_a, models_b = ({w for w in ws if re.fullmatch(r"[a-z]+\d{2,4}[a-z]*", w)} for ws in (words_a, words_b))
    return bool(models_a & models_b) and words_a & _GPU_VARIANTS == words_b & _GPU_VARIANTS


def device_mismatch(profile: Profile, *, running: bool) -> str | None:
    """One sentence when ``profile``'s device is not this machine's (module docstring), else None."""
    theirs = profile.device.name
    if profile.backend == "gloo":
        here = cpu_model()
    elif not running and not _may_have_gpu():
        return None  # planning on a machine with no GPU: nothing to compare, and no need to import torch
    else:
        import torch

        if torch.cuda.is_available():
            here = torch.cuda.get_device_name(0)
        elif running:
            here = f"{cpu_model() or 'a CPU'} with no GPU"
        else:
            return None
    if not here or not theirs or same_device(here, theirs):
        return None
    return (
        f"profile '{profile.name}' was measured on {_bare(theirs)}, but this machine is {here}: predicted times may be "
        f"far off; measure this machine with `autoplan profile --out profiles/this-machine.yaml` and plan with "
        f"`--profile profiles/this-machine.yaml`."
    )


#: Device nodes a GPU driver creates on Linux: NVIDIA's control device, AMD ROCm's and WSL's GPU paravirtualisation.
_GPU_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def _may_have_gpu() -> bool:
    """False only where no CUDA device can be: a Linux machine without a GPU driver's device node,
    or macOS (torch.cuda is never available there). Cheaper than importing torch to ask it."""
    if sys.platform == "darwin":
        return False
    if sys.platform.startswith("linux"):
        return any(Path(node).exists() for node in _GPU_NODES)
    return True


def measured_beside_predicted(
    *, measured_s: float | None, predicted_s: float | None, profile_name: str, run_dir: str
) -> list[str]:
    """The end of ``autoplan run``: measured beside predicted, and what to do when they differ
    by more than MISMATCH_RATIO."""
    if not measured_s or not predicted_s:
        return []
    ratio = measured_s / predicted_s
    lines = [f"step time: measured {measured_s:.4g} s, predicted {predicted_s:.4g} s ({100 * (ratio - 1):+.0f}%)"]
    if abs(ratio - 1) > MISMATCH_RATIO:
        lines.append(
            f"measured and predicted differ by more than {100 * MISMATCH_RATIO:.0f}%: re-measure this machine with "
            f"`autoplan profile --out profiles/this-machine.yaml`, or fit the profile to this run with "
            f"`autoplan calibrate {run_dir} --profile {profile_name} "
            f"--out profiles/{Path(profile_name).stem}-calibrated.yaml`."
        )
    return lines
