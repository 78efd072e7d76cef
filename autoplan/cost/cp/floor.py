"""The search's floor on context parallelism's exposed K,V time (docs/ilp.md, "Bounds"; docs/cost-model.md,
"Context parallelism").

Per attention call and micro-batch, the priced exposed time is ``count (t - eta min(t, overlap A))``
(cost/cp/exposed.py). It grows with the message time t and shrinks with the attention time A and with
eta <= 1, so it is floored by the messages of a rank holding the fewest K,V heads (1/tp of them: the
largest shard any split gives attention), against the attention at shard 1 (the longest it can take), at
eta = 1. A recomputed forward's second exchange is left out (>= 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.compute.op_costs import NodeTimes
from autoplan.cost.cp.exposed import exposed_s
from autoplan.cost.cp.messages import AttentionBytes, attention_bytes, attention_messages
from autoplan.cost.network.mesh import AxisGroup, mesh_groups
from autoplan.types.graph import Graph, OpNode
from autoplan.types.profile import Profile


@dataclass(frozen=True)
class CpFloor:
    """What the floor needs of a plan's context parallelism: its degree, variant and cp group."""

    cp: int
    variant: str
    group: AxisGroup


def cp_floor(profile: Profile, *, dp: int, tp: int, pp: int, cp: int, variant: str) -> CpFloor | None:
    """The CpFloor of a mesh (None at cp = 1), for ``Bounds.compute_min_s(cp=...)``."""
    if cp == 1:
        return None
    return CpFloor(cp=cp, variant=variant, group=mesh_groups(profile, dp=dp, tp=tp, pp=pp, cp=cp)["cp"])


def kv_floor_s(
    node: OpNode, graph: Graph, profile: Profile, *, floor: CpFloor, tp: int, precision: str, f: float, times: NodeTimes
) -> float:
    """The floor of ``node``'s exposed K,V seconds per micro-batch (module docstring); ``f`` is a rank's
    share of the traced batch (the micro-batch's over cp)."""
    inputs = kv_floor_inputs(node, profile, floor=floor, tp=tp, precision=precision, f=f, times=times)
    return kv_exposed_floor_s(inputs, profile=profile, floor=floor)


def kv_floor_inputs(
    node: OpNode, profile: Profile, *, floor: CpFloor, tp: int, precision: str, f: float, times: NodeTimes
) -> tuple[float, float, AttentionBytes]:
    """All :func:`kv_floor_s` reads of ``node``: its attention's forward and backward seconds at shard 1 and its
    K, Q bytes on a rank of 1/``tp`` of the heads; attentions with equal inputs have equal floors."""
    t_fwd, t_bwd = times(node, profile, precision=precision, batch_fraction=f, shard=1)
    return t_fwd, t_bwd, attention_bytes(node, precision=precision, micro_batch_fraction=f * floor.cp, shard=tp)


def kv_exposed_floor_s(inputs: tuple[float, float, AttentionBytes], *, profile: Profile, floor: CpFloor) -> float:
    """:func:`kv_floor_s` of an attention whose :func:`kv_floor_inputs` are ``inputs``."""
    t_fwd, t_bwd, tensors = inputs
    messages = attention_messages(floor.variant, cp=floor.cp, tensors=tensors)
    fwd, bwd = exposed_s(
        messages, profile=profile, group=floor.group, attention_fwd_s=t_fwd, attention_bwd_s=t_bwd, efficiency=1.0
    )
    return fwd + bwd
