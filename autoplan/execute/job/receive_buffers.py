"""The pipeline's receive slots a step starts with, for the execution audit's memory meter (docs/cost-model.md,
"Pipeline memory": the receive buffers).

torch's ``PipelineStage`` (torch 2.13 ``stage.py``) keeps, for every micro-batch i of each of this rank's chunks,
a forward slot per input it receives (``args_recv_info[i]``, not on the first chunk) and a gradient slot per
output it sends (``grad_recv_info[i]``, not on the last chunk). Each holds a tensor from the first step on:
a buffer ``_make_tensor_from_meta`` allocated once, which every later step's ``irecv`` fills in place, or, at
the V's turn (two chunks on one rank), the neighbour's tensor itself (``set_local_fwd_input``,
``set_local_bwd_input``), which stays there until the next step's replaces it. The step's own ops never make
them, so the meter (execute/job/meters.py ``LiveBytes``), which counts a storage from the op that makes it,
takes them as held when the step starts, beside the weights and optimizer states.
"""

from __future__ import annotations

from typing import Any

import torch


def receive_slots(schedule: Any) -> list[torch.Tensor]:
    """The tensors every receive slot of ``schedule``'s stages holds now (module docstring); none without a
    pipeline schedule or before its first step."""
    stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
    found = []
    for stage in (s for s in stages if s is not None):
        for slots in (getattr(stage, "args_recv_info", {}), getattr(stage, "grad_recv_info", {})):
            found += [info.buffer for infos in slots.values() for info in infos if _holds(info)]
    return found


def _holds(info: Any) -> bool:
    return not getattr(info, "is_root_arg", False) and isinstance(getattr(info, "buffer", None), torch.Tensor)
