"""Why the chosen plan syncs sparse embedding gradients and what the next option costs, in one sentence
for ``autoplan explain`` (docs/cost-model.md, "Sparse embedding gradients").

The plan is priced again on the same graph with its sparse tables read densely (``sparse_grad`` off,
nothing else changed): the tables' bytes back in DDP's all-reduced buckets instead of the all-gathered
rows a step touches. The sentence states both exposed gradient syncs and step times, and that only DDP
runs sparse gradients (the next options, tp, pp, ZeRO or compression, need ``sparse=False``).
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import CostModel, sparse_grad_summary
from autoplan.display import duration_text, number_text, si_text, trade_text
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan


def sparse_grads_why(model: CostModel, plan: Plan, cost) -> str:
    """One sentence (module docstring); '' when no table takes sparse gradients or dp = 1."""
    found = sparse_grad_summary(model.graph, plan)
    if not found.tables or plan.dp == 1:
        return ""
    dense = CostModel(dense_tables(model.graph), model.profile).estimate(plan)
    gap_s = dense.step_time_s - cost.step_time_s
    trade = trade_text(gap_s, verb="saves")
    return (
        f"{', '.join(found.tables)} take sparse gradients, so DDP all-gathers the ~{number_text(found.rows)} rows a "
        f"rank's step touches ({si_text(found.sent_bytes, 'B')} over dp={plan.dp}) instead of all-reducing "
        f"{si_text(found.table_bytes, 'B')} of tables: {duration_text(cost.dp_comm_exposed_s)} of exposed gradient "
        f"sync against {duration_text(dense.dp_comm_exposed_s)} read densely, which {trade} per step; tp, pp, ZeRO "
        "and gradient compression would need the tables read with sparse=False."
    )


def dense_tables(graph: Graph) -> Graph:
    """``graph`` with every table read densely (the trace's FLOPs and groups unchanged)."""
    params = {name: replace(info, sparse_grad=False) for name, info in graph.parameters.items()}
    return replace(graph, parameters=params)
