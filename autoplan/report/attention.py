"""What running the model's eager attention as a fused kernel would save, for ``autoplan explain``.

When the model's attention is written as ops (HF ``attn_implementation="eager"``: matmul, mask,
softmax, dropout, matmul; found by structure, autoplan/cost/compute/eager_attention.py) and the plan
runs it as written (its runtime has no ``fused_attention``), :func:`eager_attention_saving` prices
the same plan on the graph with each such subgraph replaced by SDPA's fused kernel and says, in one
line, the step time and memory it would save. Nothing is fitted: the cost model, asked again.
"""

from __future__ import annotations

from autoplan.display import duration_text
from autoplan.types.plan import Plan
from autoplan.types.runtime import runtime_named

GIB = 2**30


def eager_attention_saving(model, plan: Plan, cost) -> str:
    """One line on ``plan`` (priced ``cost`` by ``model``, a CostModel) with fused attention, or ''
    when the graph has no eager attention or the plan's runtime fuses it already."""
    if runtime_named(plan.runtime).fused_attention:
        return ""
    fused_model = model.fused_attention.eager_fused()
    if fused_model is None:
        return ""
    fused = fused_model.estimate(plan)
    saved_s = cost.step_time_s - fused.step_time_s
    count = sum(1 for node in fused_model.graph.nodes if "eager_nodes" in node.attrs)
    ops = max(node.attrs["eager_nodes"] for node in fused_model.graph.nodes if "eager_nodes" in node.attrs)
    memory = (cost.peak_memory_bytes - fused.peak_memory_bytes) / GIB
    verb = "save" if saved_s >= 0 else "add"
    return (
        f"Eager attention: {count} attention(s) are written as up to {ops} ops each (scores materialised) "
        f"and priced as written; switching to SDPA/flash (attn_implementation='sdpa') would {verb} "
        f"{duration_text(abs(saved_s))} per step ({100 * abs(saved_s) / cost.step_time_s:.1f}%: "
        f"{duration_text(cost.step_time_s)} -> {duration_text(fused.step_time_s)}) and save {memory:.2f} GiB "
        "per device."
    )
