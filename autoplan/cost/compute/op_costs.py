"""Per-op time and saved bytes: the one place an op is priced.

CostModel's block summaries (``autoplan.cost.blocks.summarise``), the intra-op ILP, ops.csv and
the search's bounds all call these functions, so the ILP optimises exactly what CostModel
prices:

    time(node, shard)  = op_time_s(node, fwd, input_bytes=I) * forward_repeats
                         + op_time_s(node, bwd, input_bytes=I, needs_grad=node in Graph.grad_nodes())
    I                  = input_bytes_of(predecessors(node))      (what the node reads, in the precision)
    saved(node, shard) = saved_activation_bytes(node) * batch_fraction / shard

Under ``fused`` (``fusion.fuses_elementwise(plan)``) a member of a fused region moves only the
bytes its region charges it and only the region's first member pays a launch
(autoplan/cost/compute/fusion.py).

``saved_activation_bytes`` rescales floating tensors to the precision and counts a dropout's
mask at 1 byte per element on a GPU profile (autoplan/cost/compute/roofline.py); a hand-made rescale of
``node.saved_bytes`` would miss that.
"""

from __future__ import annotations

from autoplan.cost.compute.dtypes import RunDtypes
from autoplan.cost.compute.fp8 import TENSORWISE, Fp8Recipe
from autoplan.cost.compute.fusion import fused_moved_bytes, fused_ops
from autoplan.cost.compute.roofline import input_bytes_of, op_time_s, saved_activation_bytes
from autoplan.cost.tp.block import predecessors
from autoplan.types.graph import Graph, OpNode
from autoplan.types.profile import Profile


def read_bytes(graph: Graph, node: OpNode, *, precision: str, dtypes: RunDtypes | None = None) -> float:
    """What ``node`` reads for the traced batch: its predecessors' outputs in their run dtypes."""
    preds = [graph.node(p) for p in predecessors(graph, node.name)]
    return input_bytes_of(preds, precision=precision, dtypes=dtypes)


def node_times_s(
    graph: Graph,
    node: OpNode,
    profile: Profile,
    *,
    precision: str,
    batch_fraction: float,
    shard: int,
    reads: float | None = None,
    recipe: Fp8Recipe = TENSORWISE,
    fused: bool = False,
    dtypes: RunDtypes | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds of ``node`` on one device for one micro-batch; ``reads`` is
    :func:`read_bytes` when the caller has it already; ``recipe`` the FP8 recipe (compute/fp8.py);
    ``fused``: element-wise ops run as fused regions (module docstring); ``dtypes``: each node's run
    dtype (compute/dtypes.py)."""
    reads = read_bytes(graph, node, precision=precision, dtypes=dtypes) if reads is None else reads
    kwargs = dict(precision=precision, batch_fraction=batch_fraction, shard=shard, input_bytes=reads, recipe=recipe)
    kwargs["dtypes"] = dtypes
    member = fused_ops(graph).get(node.name) if fused else None
    moved = {}
    if member is not None:
        gpu = profile.backend == "nccl"
        moved = {
            backward: fused_moved_bytes(
                graph, node, member, precision=precision, gpu=gpu, backward=backward, dtypes=dtypes
            )
            for backward in (False, True)
        }
        kwargs["launches"] = member.launches
    needs_grad = node.name in graph.grad_nodes()
    backward = op_time_s(node, profile, backward=True, needs_grad=needs_grad, moved=moved.get(True), **kwargs)
    return op_time_s(node, profile, moved=moved.get(False), **kwargs), backward


class NodeTimes:
    """:func:`node_times_s` of one graph on one profile, memoised: a search prices the same op at
    the same micro-batch and shard in its bounds, its block ILPs and CostModel's block summaries.
    Keyed on the node, precision, batch fraction, shard, bytes read and FP8 recipe (the same numbers: the
    function is pure); a call with another profile is not memoised."""

    def __init__(self, graph: Graph, profile: Profile):
        self.graph, self.profile = graph, profile
        self._times: dict[tuple, tuple[float, float]] = {}
        self._reads: dict[tuple, float] = {}

    def __call__(
        self,
        node: OpNode,
        profile: Profile,
        *,
        precision: str,
        batch_fraction: float,
        shard: int,
        reads: float | None = None,
        recipe: Fp8Recipe = TENSORWISE,
        fused: bool = False,
        dtypes: RunDtypes | None = None,
    ) -> tuple[float, float]:
        kwargs = dict(precision=precision, batch_fraction=batch_fraction, shard=shard, recipe=recipe, fused=fused)
        kwargs["dtypes"] = dtypes
        if profile is not self.profile:
            return node_times_s(self.graph, node, profile, reads=reads, **kwargs)
        reads = self.reads(node, precision=precision, dtypes=dtypes) if reads is None else reads
        key = (node.name, precision, batch_fraction, shard, reads, recipe, fused, dtypes)
        hit = self._times.get(key)
        if hit is None:
            hit = self._times[key] = node_times_s(self.graph, node, profile, reads=reads, **kwargs)
        return hit

    def reads(self, node: OpNode, *, precision: str, dtypes: RunDtypes | None = None) -> float:
        """:func:`read_bytes` of ``node``, memoised: it reads the graph alone, whatever the node's context."""
        hit = self._reads.get((node.name, precision, dtypes))
        if hit is None:
            hit = self._reads[node.name, precision, dtypes] = read_bytes(
                self.graph, node, precision=precision, dtypes=dtypes
            )
        return hit


def node_time_s(
    graph: Graph,
    node: OpNode,
    profile: Profile,
    *,
    precision: str,
    batch_fraction: float,
    shard: int,
    forward_repeats: int = 1,
    times: NodeTimes | None = None,
    recipe: Fp8Recipe = TENSORWISE,
    fused: bool = False,
    dtypes: RunDtypes | None = None,
) -> float:
    """Forward (``forward_repeats`` times: 2 under full recomputation) + backward seconds;
    ``times`` memoises them (:class:`NodeTimes`)."""
    kwargs = dict(precision=precision, batch_fraction=batch_fraction, shard=shard, recipe=recipe, fused=fused)
    kwargs["dtypes"] = dtypes
    fwd, bwd = times(node, profile, **kwargs) if times else node_times_s(graph, node, profile, **kwargs)
    return forward_repeats * fwd + bwd


def node_saved_bytes(node: OpNode, profile: Profile, *, precision: str, dtypes: RunDtypes | None = None) -> float:
    """Bytes ``node`` keeps for the backward, for the whole traced batch, in the run's dtypes."""
    return saved_activation_bytes(node, precision=precision, gpu=profile.backend == "nccl", dtypes=dtypes)
