"""--verify's buffers: after each compared step, every buffer a rank holds against the reference's copy for that
rank's dp index (docs/executor.md, "CLI", ``--verify``).

A forward may update buffers (BatchNorm's running statistics, a spectral norm's vectors, a running mean). They do
not enter this step's gradients when the forward only writes them (BatchNorm in training reads its batch's own
statistics), so a run could update them wrongly and pass: twice a step under recomputation, once more in torch's
pipeline shape inference, on a sequence shard. The reference keeps each dp rank's buffers as the run's ranks
keep theirs (reference_buffers.py); each rank compares its own with its dp index's, ``||b - b_ref|| /
max(||b_ref||, FLOOR ||B_ref||)`` (``B_ref`` all the reference's floating buffers) at the gradient tolerance, and
integer buffers (``num_batches_tracked``) exactly. A buffer the reference does not hold (made by the executor's
own modules) is not compared.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from autoplan.execute.job.reference_buffers import RankBuffers

SUFFIX = " (buffer)"


def expected_buffers(model: nn.Module, buffers: RankBuffers | None, dp_index: int) -> dict[str, torch.Tensor]:
    """The reference's buffers for dp index ``dp_index`` after its step: that rank's kept copy where each dp rank
    keeps its own, else the reference model's."""
    if buffers is not None and buffers.any and buffers.kept is not None:
        return dict(buffers.kept[dp_index])
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def buffer_differences(stage_modules, expected: dict[str, torch.Tensor], rename) -> list:
    """This rank's buffers against ``expected`` (module docstring), named by ``rename`` (verify.original_name);
    a collective only for a DTensor buffer, over its own mesh."""
    from autoplan.execute.job.verify import Difference

    expected = {rename(name): tensor for name, tensor in expected.items()}
    floating = [t.double() for t in expected.values() if t.is_floating_point()]
    floor = 1e-3 * math.sqrt(sum(float(t.pow(2).sum()) for t in floating))
    found = []
    for module in stage_modules:
        for name, buffer in module.named_buffers():
            name = rename(name)
            ref = expected.get(name)
            if ref is None:
                continue
            held = (buffer.full_tensor() if isinstance(buffer, DTensor) else buffer).detach().cpu().double()
            ref = ref.detach().cpu().double()
            if held.shape != ref.shape:
                found.append(Difference(f"{name}{SUFFIX} (mis-shaped)", math.inf, 0.0))
                continue
            diff = held - ref
            exact = not buffer.is_floating_point()
            error = float(diff.norm())
            if exact and error:
                error = math.inf  # an integer buffer (a count) must be equal
            top = float(diff.abs().max()) if diff.numel() else 0.0
            found.append(Difference(f"{name}{SUFFIX}", error, float(ref.norm()), 0.0 if exact else floor, top))
    return found
