"""Activation offload (``Plan.offload_activations``; docs/cost-model.md, "Activation offload").

Each block that does not recompute sends the activations it saves for its backward to host memory
as its forward saves them, and brings them back as its backward reads them (torch's
``torch.autograd.graph.saved_tensors_hooks``, the mechanism of ``save_on_cpu``; Megatron-LM's
``--cpu-offloading``). What stays on the device: the parameters, the block's inputs (the residual
stream at the block boundary, and shared inputs such as rotary tables), and what nodes outside the
blocks save. Offloading what recompute drops makes no sense, so a block that recomputes keeps its
checkpoint on the device and offloads nothing: the plan must leave some block without recompute
(``recompute="none"``, or a budget, ``recompute_blocks``; autoplan/types/recompute.py).

The executor offloads plain tensors (autoplan/execute/activation_offload.py): tp, cp and ep, whose
activations are DTensors or routed token buffers, are refused, and so is ``compile`` (inductor's
saved tensors do not pass through the hooks one block at a time).
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError

#: runtimes whose price of activation offload is autoplan's executor's (export/megatron.py says Megatron's)
ACTIVATION_OFFLOAD_RUNTIMES = ("autoplan",)


def check_activation_offload(plan: Any) -> None:
    """The rules of ``Plan.offload_activations`` (module docstring), one sentence each."""
    if not isinstance(plan.offload_activations, bool):
        raise PlanError(f"plan offload_activations={plan.offload_activations!r}; expected true or false.")
    if not plan.offload_activations:
        return
    refusal = offload_refusal(plan)
    if refusal == "parallel":
        raise PlanError(
            f"plan offload_activations=true with {plan.describe()}: the executor offloads plain tensors, and tp, cp "
            "and ep hold DTensor or routed activations; use tp=cp=ep=1 or offload_activations=false."
        )
    if refusal == "compile":
        raise PlanError(
            "plan offload_activations=true with compile=true: compiled blocks save their tensors inside inductor's "
            "graph, out of the offload hooks' reach; use compile=false or offload_activations=false."
        )
    if refusal == "recompute":
        raise PlanError(
            f"plan offload_activations=true with recompute='{plan.recompute}' on every block: a recomputed block "
            "keeps only its checkpoint, so nothing would be offloaded; use recompute='none', a budget "
            "(recompute_blocks), or offload_activations=false."
        )
    if refusal == "runtime":
        raise PlanError(
            f"plan offload_activations=true with runtime '{plan.runtime}': only autoplan's executor is priced for it "
            "(`autoplan export` writes Megatron-LM's --cpu-offloading from an autoplan plan); use runtime 'autoplan'."
        )


def offload_refusal(plan: Any) -> str | None:
    """Which rule of the module docstring refuses ``plan``'s activations on the host, whatever its
    ``offload_activations`` says ("parallel", "compile", "recompute" or "runtime"), or None: no message built,
    so the search can ask it of every plan it bounds (solve/activation_offload.py)."""
    if plan.tp > 1 or plan.cp > 1 or plan.ep > 1:
        return "parallel"
    if plan.compile:
        return "compile"
    if plan.recompute != "none" and not plan.recompute_blocks:
        return "recompute"
    return "runtime" if plan.runtime not in ACTIVATION_OFFLOAD_RUNTIMES else None


def offloaded_blocks(*, recomputed: list[str], blocks: list[str]) -> list[str]:
    """The blocks whose saved activations go to the host: every block that does not recompute."""
    rerun = set(recomputed)
    return [block for block in blocks if block not in rerun]
