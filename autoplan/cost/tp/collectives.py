"""What one tensor-parallel collective sends: the bytes of the tensor it moves in the run's dtype.

Every TP term (cost/tp/splits.py) names the traced tensor whose values (or gradient) it moves:
an all-gather or all-reduce of a node's output, of its gradient, or of an edge's tensor into a
split node. A rank sends, per micro-batch,

    bytes = traced_bytes(t) * batch_fraction * bytes(d(t)) / bytes(traced dtype of t)

with d(t) the run dtype of the tensor's node under the plan's precision policy (compute/dtypes.py:
torch.autocast's rules, so under bf16 autocast a rowwise linear's partial output is all-reduced in
bf16 while the fp32 residual stream, the norms on it and the embedding's output, and the gradients
of all three, travel in fp32). A gradient has its tensor's dtype (autograd casts it back to the
input's). Without a policy (fp32, and runtimes that cast the whole model) every tensor is in the
precision: ``bytes(precision) / bytes(graph dtype)``.
"""

from __future__ import annotations

from autoplan.cost.compute.dtypes import dtypes_of
from autoplan.cost.compute.roofline import PRECISION_BYTES
from autoplan.cost.network.comm import collective_time_s
from autoplan.types.graph import Graph

_TRACED_BYTES = {"float32": 4, "float": 4, "float16": 2, "bfloat16": 2, "half": 2}


class Collectives:
    """Collective seconds on the tp group for a tensor's traced bytes, rescaled to the micro-batch and
    to the tensor's run dtype (module docstring); ``ctx`` a cost/tp/splits.py TPContext."""

    def __init__(self, graph: Graph, ctx):
        self.graph, self.ctx = graph, ctx
        self.dtypes = dtypes_of(graph, ctx.dtypes)
        traced = _TRACED_BYTES.get(graph.dtype.replace("torch.", ""), 4)
        self.factor = ctx.batch_fraction * PRECISION_BYTES[ctx.precision] / traced  # without a policy

    def scale(self, tensor: str) -> float:
        """Bytes a rank sends per traced byte of ``tensor`` (a node name)."""
        if self.dtypes is None:
            return self.factor
        return self.ctx.batch_fraction * self.dtypes.scale(self.graph.node(tensor))

    def __call__(self, kind: str, traced_bytes: float, tensor: str) -> float:
        size = traced_bytes * self.scale(tensor)
        return collective_time_s(self.ctx.profile, kind, size, group=self.ctx.group)

    def scalars(self, kind: str, size_bytes: float, count: int) -> float:
        """``count`` collectives of ``size_bytes`` each, whatever the batch and dtypes (FP8 scales, cost/tp/amax.py)."""
        return count * collective_time_s(self.ctx.profile, kind, size_bytes, group=self.ctx.group) if count else 0.0


class Messages:
    """A sum of collectives, kind -> [count, bytes]: the terms' algebra with messages for seconds
    (``0.0`` is the empty sum), so the same term code states what a block sends."""

    def __init__(self, by_kind: dict[str, list] | None = None):
        self.by_kind = {k: list(v) for k, v in (by_kind or {}).items()}

    def __add__(self, other: "Messages | float") -> "Messages":
        if not isinstance(other, Messages):
            return self
        merged = Messages(self.by_kind)
        for kind, (count, size) in other.by_kind.items():
            entry = merged.by_kind.setdefault(kind, [0, 0.0])
            entry[0], entry[1] = entry[0] + count, entry[1] + size
        return merged

    __radd__ = __add__

    def times(self, n: int) -> "Messages":
        return Messages({k: [c * n, b * n] for k, (c, b) in self.by_kind.items()})


class MessageCollectives:
    """One message of ``kind`` per call, in the bytes :class:`Collectives` prices (it holds one)."""

    def __init__(self, graph: Graph, ctx):
        self.priced = Collectives(graph, ctx)

    def __call__(self, kind: str, traced_bytes: float, tensor: str) -> Messages | float:
        size = traced_bytes * self.priced.scale(tensor)
        return Messages({kind: [1, size]}) if size > 0 and self.priced.ctx.tp > 1 else 0.0

    def scalars(self, kind: str, size_bytes: float, count: int) -> Messages | float:
        """``count`` messages of ``size_bytes`` each (:meth:`Collectives.scalars`)."""
        return Messages({kind: [count, count * size_bytes]}) if count and self.priced.ctx.tp > 1 else 0.0
