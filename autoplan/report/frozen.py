"""What the model's frozen parameters save the chosen plan, in one sentence for ``autoplan explain``
(docs/cost-model.md, "Frozen parameters").

The plan is priced again on the same graph with every parameter trainable (CostModel, nothing
else changed): the difference in gradient and optimizer bytes per device and in the data-parallel
sync (``dp_comm_s + zero_comm_s``), and whether the plan would still fit. The weight-gradient
FLOPs the backward skips are counted from the trace: a frozen linear, convolution or matmul's
weight gradient costs what its forward does (one GEMM of the same shape, 2 m k n; Narayanan et
al. SC'21 eq. 3 counts the backward as two such GEMMs), so their forward FLOPs are a floor of what
the traced backward leaves out (nodes behind frozen ones also skip their input gradients).
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel, usable_bytes
from autoplan.display import duration_text, number_text, si_text
from autoplan.types.graph import PARAM_KINDS, Graph
from autoplan.types.plan import Plan

GIB = 2**30


def frozen_saving(model: CostModel, plan: Plan, cost) -> str:
    """One sentence on the frozen parameters of ``model``'s graph under ``plan`` (priced as
    ``cost``), or "" when every parameter trains."""
    graph = model.graph
    frozen = graph.param_count - graph.trainable_param_count
    if not frozen:
        return ""
    trained = CostModel(all_trainable(graph), model.profile).estimate(plan)
    states = trained.grads_bytes + trained.optimizer_bytes - cost.grads_bytes - cost.optimizer_bytes
    sync_s = (trained.dp_comm_s + trained.zero_comm_s) - (cost.dp_comm_s + cost.zero_comm_s)
    skipped = weight_grad_flops_skipped(graph)
    share = skipped / (graph.step_flops + skipped)
    fits = trained.peak_memory_bytes <= usable_bytes(model.profile.device.memory_bytes)
    return (
        f"{frozen / graph.param_count:.1%} of the parameters are frozen ({si_text(frozen, '')} of "
        f"{si_text(graph.param_count, '')}): they hold no gradients or optimizer state "
        f"({number_text(states / GIB)} GiB per device less than training them all under this plan, which would peak at "
        f"{number_text(trained.peak_memory_bytes / GIB)} GiB and {'still fit' if fits else 'not fit'}), send no "
        f"gradient sync ({duration_text(max(0.0, sync_s))} less per step) and skip at least "
        f"{si_text(skipped, 'FLOP')} of weight gradients per global batch ({share:.0%} "
        "of what training them all would compute)."
    )


def all_trainable(graph: Graph) -> Graph:
    """``graph`` with every parameter trainable (the trace's FLOPs and groups unchanged)."""
    return replace(graph, parameters={name: replace(info, trainable=True) for name, info in graph.parameters.items()})


def weight_grad_flops_skipped(graph: Graph) -> float:
    """FLOPs of the weight gradients the frozen parameters do not get, per global batch (module
    docstring): the forward FLOPs of each parameterised node whose named parameters are all frozen."""
    return float(
        sum(
            node.fwd_flops
            for node in graph.nodes
            if node.op in PARAM_KINDS and node.param_names and not graph.trains(node)
        )
    )
