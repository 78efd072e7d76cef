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

from dataclasses import fields

from autoplan.cost.compute.dtypes import RunDtypes
from autoplan.cost.compute.fp8 import TENSORWISE, Fp8Recipe
from autoplan.cost.compute.fusion import fused_moved_bytes, fused_ops
from autoplan.cost.compute.roofline import input_bytes_of, op_time_s, saved_activation_bytes
from autoplan.cost.pp.split_backward import weight_grad_held_bytes
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
    Keyed on what the node is (:func:`priced_facts`: equal for the same op in identical blocks), the
    precision, batch fraction, shard, bytes read, FP8 recipe and fusion: the function is pure, and reads
    nothing else of the node or graph. Of the run dtypes it reads only the node's and, fused, its region's
    inputs' (``activation_scale``), which its facts hold: dtype policies that agree on them share its times.
    A call with another profile is not memoised."""

    def __init__(self, graph: Graph, profile: Profile):
        self.graph, self.profile = graph, profile
        self._times: dict[tuple, tuple[float, float]] = {}
        self._reads: dict[tuple, float] = {}
        self._kinds: dict[tuple, tuple[int, OpNode]] = {}  # (id(node), dtypes, fused) -> (kind, node kept alive)
        self._kind_ids: dict[tuple, int] = {}  # priced facts -> kind
        self._known: dict[tuple, tuple[int, float, OpNode]] = {}  # (id(node), precision, dtypes, fused) -> kind, reads
        self.outside_prices: dict[tuple, object] = {}  # memory_budget's (cost/tp/split_prices.py), per context

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
        if profile is self.profile:  # the arguments are gathered only to price a miss: most calls hit
            known = self._known.get((id(node), precision, dtypes, fused)) or self._know(node, precision, dtypes, fused)
            reads = known[1] if reads is None else reads
            key = (known[0], precision, batch_fraction, shard, reads, recipe, fused)  # kind: dtypes' reads
            hit = self._times.get(key)
            if hit is not None:
                return hit
        kwargs = dict(precision=precision, batch_fraction=batch_fraction, shard=shard, recipe=recipe, fused=fused)
        times = node_times_s(self.graph, node, profile, reads=reads, dtypes=dtypes, **kwargs)
        if profile is self.profile:
            self._times[key] = times
        return times

    def _know(self, node: OpNode, precision: str, dtypes: RunDtypes | None, fused: bool) -> tuple[int, float, OpNode]:
        """The node's kind and :meth:`reads`, looked up once per node object and arguments they read."""
        kind, read = self.kind(node, dtypes=dtypes, fused=fused), self.reads(node, precision=precision, dtypes=dtypes)
        known = self._known[id(node), precision, dtypes, fused] = (kind, read, node)
        return known

    def kind(self, node: OpNode, *, dtypes: RunDtypes | None, fused: bool) -> int:
        """A number per distinct :func:`priced_facts`, found once per node object (kept alive, so its id stays its)."""
        hit = self._kinds.get((id(node), dtypes, fused))
        if hit is None:
            facts = priced_facts(self.graph, node, dtypes=dtypes, fused=fused)
            hit = self._kinds[id(node), dtypes, fused] = (self._kind_ids.setdefault(facts, len(self._kind_ids)), node)
        return hit[0]

    def reads(self, node: OpNode, *, precision: str, dtypes: RunDtypes | None = None) -> float:
        """:func:`read_bytes` of ``node``, memoised: it reads the graph alone, whatever the node's context."""
        hit = self._reads.get((node.name, precision, dtypes))
        if hit is None:
            hit = self._reads[node.name, precision, dtypes] = read_bytes(
                self.graph, node, precision=precision, dtypes=dtypes
            )
        return hit


#: the fields of an OpNode that name or place it: node_times_s reads none of them (it reads the graph by
#: the node's name only for what priced_facts adds)
NAMING_FIELDS = ("name", "module", "layer", "param_names")


def priced_facts(graph: Graph, node: OpNode, *, dtypes: RunDtypes | None, fused: bool) -> tuple:
    """All :func:`node_times_s` reads of ``node`` beyond its other arguments: nodes with equal facts get equal
    times at equal arguments (:class:`NodeTimes` keys on them).

        own     every field of the node but those that name or place it (NAMING_FIELDS), attrs in full
        graph   whether it needs a gradient (Graph.grad_nodes) and its run dtype (RunDtypes.dtype); under
                ``fused`` its region membership (fusion.FusedOp: writes, launches, and of each input charged
                to it the output bytes, traced dtype and run dtype, all that input_bytes_of reads of it)

    What it reads of its predecessors (``reads``, :func:`read_bytes`) is an argument of its own."""
    own = tuple(_frozen(getattr(node, f.name)) for f in fields(node) if f.name not in NAMING_FIELDS)

    def run(n: OpNode) -> str | None:
        return dtypes.dtype(n) if dtypes is not None else None

    member = fused_ops(graph).get(node.name) if fused else None
    region = None
    if member is not None:
        charged = tuple((p.output_bytes, p.output_dtype, run(p)) for p in map(graph.node, member.reads))
        region = (member.writes, member.launches, charged)
    return own, node.name in graph.grad_nodes(), run(node), region


def _frozen(value: object) -> object:
    """``value`` hashable, equal to another's only for equal values of the same types (attrs hold dicts, lists)."""
    if isinstance(value, dict):
        return "dict", tuple((key, _frozen(value[key])) for key in sorted(value, key=repr))
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return type(value).__name__, tuple(_frozen(v) for v in items)
    return type(value).__name__, value


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
    if times is not None:  # keywords passed as they are: the memo's hits cost no dict of them
        fwd, bwd = times(
            node, profile, precision=precision, batch_fraction=batch_fraction, shard=shard, recipe=recipe,
            fused=fused, dtypes=dtypes,
        )  # fmt: skip
    else:
        kwargs = dict(precision=precision, batch_fraction=batch_fraction, shard=shard, recipe=recipe, fused=fused)
        fwd, bwd = node_times_s(graph, node, profile, dtypes=dtypes, **kwargs)
    return forward_repeats * fwd + bwd


def node_saved_bytes(node: OpNode, profile: Profile, *, precision: str, dtypes: RunDtypes | None = None) -> float:
    """Bytes ``node`` keeps for the backward, for the whole traced batch, in the run's dtypes."""
    return saved_activation_bytes(node, precision=precision, gpu=profile.backend == "nccl", dtypes=dtypes)


def held_bytes(
    graph: Graph, node: OpNode, *, gpu: bool, precision: str, dtypes: RunDtypes | None
) -> tuple[float, float]:
    """(``saved_activation_bytes``, ``weight_grad_held_bytes``) of ``node`` for the traced batch: they read the
    graph, the node, the precision, its run dtypes and whether the profile is a GPU's, not the context's shards or
    micro-batch, so they are cached on the graph per node name and those arguments (as fusion.py caches regions)."""
    cache = graph.__dict__.setdefault("_held_bytes_cache", {})
    key = (node.name, gpu, precision, dtypes)
    hit = cache.get(key)
    if hit is None:
        kw = dict(precision=precision, dtypes=dtypes)
        hit = cache[key] = (saved_activation_bytes(node, gpu=gpu, **kw), weight_grad_held_bytes(graph, node, **kw))
    return hit
