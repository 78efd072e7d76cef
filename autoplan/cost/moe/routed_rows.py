"""What a rank's step costs per row its experts receive: the audit's price at the routing a run had
(docs/cost-model.md, "The execution audit").

The price assumes balanced routing: each rank's experts receive ``R = E C f s`` rows per MoE layer and micro-batch
(cost/moe/experts.py ``dispatch_bytes`` at ``i = 1``). A real router sends rank ``r`` ``R_r`` rows instead, and
three audited quantities follow them linearly (execute/expert_dispatch.py):

- the ep all-to-alls whose input is the received rows: the combine of each forward run and the gradient of the
  dispatch, ``(a + 1) H b`` bytes a row (``a`` the forward's runs of its all-to-alls, 1 + re-runs under full
  recompute: experts.py ``a2a_per_microbatch``); the dispatch and the combine's gradient send the rank's own rows;
- the expert GEMMs' FLOPs, ``sum_g fwd_g / (E C)`` forward and ``sum_g bwd_g / (E C)`` backward a row over the
  layer's traced grouped GEMMs ``g`` (``[E, C, N]``), the forward again per re-run under full recompute;
- the rows the dispatch counts, once per run of the layer's forward (recomputation re-runs it).

So the price of rank ``r`` is the balanced price plus ``(rows_r - rows) * per_row`` for each quantity, ``rows`` the
counted rows at balance: :class:`RoutedRows` holds both, summed over a stage's layers (exact when a rank's surplus
falls on its layers in proportion to their rows, as it does with one layer's routing repeated). Under expert tensor
parallelism a rank's GEMMs run on its etp group's gathered rows, not its own: their FLOPs keep the balanced price.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.cost.compute.roofline import PRECISION_BYTES, executed_bwd_flops
from autoplan.cost.moe.experts import dispatch_bytes, is_expert_gemm
from autoplan.types.audit_prediction import A2A_ROW, BACKWARD_FLOPS, FORWARD_FLOPS
from autoplan.types.graph import Graph, OpNode
from autoplan.types.moe import MoELayer


@dataclass
class RoutedRows:
    """One rank's counted rows per step at balanced routing, and each quantity's share of the price that follows
    them (bytes or FLOPs), summed over the stage's MoE layers (module docstring)."""

    rows: float = 0.0
    routed: dict[str, float] = field(default_factory=dict)

    def add(self, rows: float, **routed: float) -> None:
        self.rows += rows
        for what, value in routed.items():
            self.routed[what] = self.routed.get(what, 0.0) + value

    def per_row(self) -> dict[str, float]:
        """{quantity: what one more received row adds}; empty without rows."""
        return {what: value / self.rows for what, value in self.routed.items()} if self.rows else {}


def add_layer(
    found: RoutedRows,
    graph: Graph,
    moe: MoELayer,
    *,
    precision: str,
    batch_fraction: float,
    tokens: float,
    microbatches: int,
    runs: float,
    a2a_runs: float,
    ep: int,
    expert_tp: int,
) -> None:
    """Add one MoE layer's ``microbatches`` to ``found``: ``runs`` the forward's runs per micro-batch (1 + re-runs
    under any recompute), ``a2a_runs`` its all-to-alls' (1 + re-runs under full recompute, whose GEMMs re-run too)."""
    rows = dispatch_bytes(moe, precision=precision, batch_fraction=batch_fraction, imbalance=1.0, tokens=tokens)
    rows /= moe.hidden_size * PRECISION_BYTES[precision]
    routed: dict[str, float] = {}
    if ep > 1:
        routed[A2A_ROW] = (
            (a2a_runs + 1) * rows * moe.hidden_size * PRECISION_BYTES[precision]
        )  # combines, dispatch grad
    if expert_tp == 1:
        gemms = [n for n in batched_matmuls(graph) if is_expert_gemm(n, moe)]
        traced = moe.num_experts * moe.slots_per_expert
        fwd, bwd = sum(n.fwd_flops for n in gemms) / traced, sum(executed_bwd_flops(n) for n in gemms) / traced
        routed[FORWARD_FLOPS] = rows * fwd
        routed[BACKWARD_FLOPS] = rows * (bwd + (a2a_runs - 1) * fwd)
    found.add(microbatches * runs * rows, **{k: microbatches * v for k, v in routed.items()})


def batched_matmuls(graph: Graph) -> list[OpNode]:
    """The nodes of ``graph`` that :func:`is_expert_gemm` may accept for some layer (a matmul or linear with a
    3-d output), in graph order: listed once per node list and cached on the graph (as compute/op_costs.py's
    held_bytes caches), where a scan of every node per MoE layer took 0.2 s of DeepSeek-V3's predicted trace
    (58 layers x 9,598 nodes, cli/solve.py). A new node list (another length or object) is listed again."""
    nodes = graph.nodes
    hit = graph.__dict__.get("_batched_matmuls")
    if hit is None or hit[0] is not nodes or hit[1] != len(nodes):
        found = [n for n in nodes if n.op in ("matmul", "linear") and len(n.output_shape) == 3]
        hit = graph.__dict__["_batched_matmuls"] = (nodes, len(nodes), found)
    return hit[2]
