"""``Plan.offload_activations`` in each framework's terms (docs/export.md, "Activation offload"):

- Megatron-LM: ``--cpu-offloading-num-layers N`` (validate_args sets ``--cpu-offloading`` from it; Megatron-Core
  0.16.1 ``TransformerConfig``: activations offloaded, weights not, N < num_layers, no pipeline, no recompute).
  autoplan offloads every block that does not recompute; Megatron offloads the first N layers and keeps the
  last one's on the GPU, so N = L - 1 with a note; a pipeline or a recompute budget beside it: one sentence;
- torchtitan 0.3.0: no activation offload in its job config (only its experimental graph trainer has one);
- DeepSpeed: its ``activation_checkpointing.cpu_checkpointing`` offloads the checkpoints of recomputed layers,
  the opposite rule; Accelerate: no switch. Each gets one sentence in ``unexpressed``.

Megatron's config read back keeps ``--cpu-offloading-num-layers`` as a setting autoplan does not price for
Megatron's runtime (types/activation_offload.py: the price is autoplan's executor's).
"""

from __future__ import annotations

from typing import Any

from autoplan.types.plan import Plan

CANNOT = {
    "torchtitan": "torchtitan 0.3.0's job config has no activation offload (only its experimental graph trainer)",
    "DeepSpeed": "DeepSpeed's cpu_checkpointing offloads only the checkpoints of recomputed layers",
    "Accelerate": "Accelerate has no activation offload switch",
}


def activation_offload_notes(plan: Plan, framework: str) -> list[str]:
    """One sentence where ``framework`` (a key of :data:`CANNOT`) cannot say the plan's activation offload."""
    if not plan.offload_activations:
        return []
    return [
        f"offload_activations: {CANNOT[framework]}; the config keeps every activation on the GPU, "
        "so its memory exceeds the plan's."
    ]


def megatron_activation_flags(plan: Plan, layers: int | None, notes: list[str]) -> list[tuple[str, Any]]:
    """``--cpu-offloading-num-layers`` (module docstring), or a note saying why Megatron cannot run it."""
    if not plan.offload_activations:
        return []
    if plan.pp > 1 or plan.recompute != "none":
        why = "a pipeline" if plan.pp > 1 else "activation recomputation"
        notes.append(
            f"offload_activations with {why}: Megatron-LM's --cpu-offloading refuses {why}; the config keeps every "
            "activation on the GPU."
        )
        return []
    if not layers or layers < 2:
        notes.append("offload_activations: the trace states no layer count to pass --cpu-offloading-num-layers.")
        return []
    notes.append(
        f"offload_activations: Megatron-LM offloads at most num_layers - 1 = {layers - 1} layers (the last layer's "
        f"activations stay on the GPU), asynchronously on a side stream; autoplan priced all {layers}, in series."
    )
    return [("--cpu-offloading-num-layers", layers - 1)]
