"""Which outer syncs the search offers one (degrees, ZeRO stage, gradient sync) (docs/ilp.md, section 4;
docs/cost-model.md, "Local SGD and DiLoCo"): synchronous always; under ``--allow-lossy``, where the executor
runs it (types/local_sgd.py ``outer_sync_refusal``), local SGD's plain averaging every
:data:`LOCAL_SGD_EVERY` steps and DiLoCo every :data:`DILOCO_EVERY` steps. The cost model cannot see how
H slows convergence, so these are the published settings, not a sweep: left to price alone, the search
would take the largest H it is offered. ``--fix sync_every=N`` and ``--fix outer_optimizer=...`` pin them.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from autoplan.errors import PlanError
from autoplan.types.local_sgd import OUTER_OPTIMIZERS, outer_sync_refusal

#: post-local SGD's period: Lin et al., "Don't Use Large Mini-Batches, Use Local SGD" (ICLR 2020), H = 16
LOCAL_SGD_EVERY = 16
#: DiLoCo's inner steps per outer step: Douillard et al. 2023 (arXiv:2311.08105), section 3, H = 500
DILOCO_EVERY = 500
SYNCHRONOUS = (1, "average")
#: (sync_every, outer_optimizer) offered under --allow-lossy (module docstring)
CANDIDATES = ((LOCAL_SGD_EVERY, "average"), (DILOCO_EVERY, "nesterov"))


def check_local_sgd_pins(fixes: dict, *, allow_lossy: bool) -> None:
    """An outer sync pinned without --allow-lossy: one sentence."""
    every, outer = fixes.get("sync_every"), fixes.get("outer_optimizer")
    if allow_lossy or (every or 1) == 1 and (every is not None or outer in (None, "average")):
        return
    asked = f"sync_every={every}" if every else f"outer_optimizer={outer} (DiLoCo every {DILOCO_EVERY} steps)"
    raise PlanError(
        f"--fix {asked} is lossy (the replicas train apart between outer syncs, so the optimizer never sees the "
        "whole batch's gradient); add --allow-lossy to allow it, or pin sync_every=1."
    )


def outer_sync_options(*, deg: Any, zero: int, grads: Any, fixes: dict, allow_lossy: bool, runtime: str) -> list:
    """The (sync_every, outer_optimizer) choices of one (degrees, ZeRO stage, gradient sync), narrowed by the pins
    (module docstring); [] when a pinned outer sync cannot run on this layout."""
    layout = SimpleNamespace(
        dp=deg.dp, zero_stage=zero, dp_replicate=grads.replicate, ep=deg.ep, cp=deg.cp,
        grad_compression=grads.compression, offload=grads.offload, runtime=runtime,
    )  # fmt: skip
    runs = not outer_sync_refusal(layout)
    offered = [SYNCHRONOUS, *(CANDIDATES if allow_lossy else ())]
    every, outer = fixes.get("sync_every"), fixes.get("outer_optimizer")
    if every is not None:
        names = [outer] if outer else (["average"] if every == 1 else list(OUTER_OPTIMIZERS))
        offered = [(every, name) for name in names]
    elif outer is not None:
        offered = [o for o in offered if o[1] == outer]
    return [o for o in offered if o == SYNCHRONOUS or runs]
