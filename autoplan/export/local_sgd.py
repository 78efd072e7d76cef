"""Local SGD and DiLoCo (types/local_sgd.py) in the trainers autoplan exports to: none runs it from its config,
so each export states it in one sentence and writes the synchronous config (checked in the installed releases):

- torchtitan 0.3: only its torchft experiment (torchtitan/experiments/torchft: ``fault_tolerance.semi_sync_method``
  "diloco" or "local_sgd" with ``sync_steps``, the outer SGD fixed at lr 0.7, momentum 0.9), which needs torchft's
  lighthouse and one trainer job per replica group;
- Megatron-Core 0.16 and DeepSpeed 0.19: no local SGD and no outer optimizer;
- Accelerate 1.16: ``accelerate.local_sgd.LocalSGD(accelerator, model, local_sgd_steps=H)``, plain averaging
  under DDP only (no FSDP, no outer optimizer), a context manager in the training script.
"""

from __future__ import annotations

from autoplan.types.local_sgd import is_local_sgd
from autoplan.types.plan import Plan

_TORCHTITAN = (
    "torchtitan 0.3 runs DiLoCo and local SGD only in its torchft experiment (fault_tolerance.semi_sync_method "
    "'{name}', sync_steps={h}, outer SGD fixed at lr 0.7 and momentum 0.9), which needs torchft's lighthouse and "
    "one job per replica group"
)
_ACCELERATE_CODE = (
    "it is code in the training script: with LocalSGD(accelerator, model, local_sgd_steps={h}) as local_sgd, "
    "call local_sgd.step() after each optimizer step (accelerate.local_sgd, plain averaging under DDP)"
)
_NONE = "{framework} has no local SGD or outer optimizer"


def local_sgd_notes(plan: Plan, framework: str) -> list[str]:
    """One sentence for a plan that syncs its replicas every H steps (module docstring); [] otherwise."""
    if not is_local_sgd(plan):
        return []
    h, name = plan.sync_every, "diloco" if plan.outer_optimizer == "nesterov" else "local_sgd"
    plain_ddp = plan.outer_optimizer == "average" and plan.zero_stage == 0 and plan.tp == plan.pp == 1
    if framework == "torchtitan":
        why = _TORCHTITAN.format(name=name, h=h)
    elif framework == "Accelerate" and plain_ddp:
        why = _ACCELERATE_CODE.format(h=h)
    else:
        why = _NONE.format(framework=framework)
    what = "DiLoCo" if name == "diloco" else "local SGD"
    return [
        f"sync_every={h} ({what}, outer_optimizer={plan.outer_optimizer}): {why}; this config syncs the gradients "
        "every step, so its data-parallel traffic is the synchronous plan's, not the priced one."
    ]
