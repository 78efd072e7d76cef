"""What the pipeline partition (solve/pipeline.py) charges one block, from CostModel's block summaries.

Per block and micro-batch (the rule of :func:`autoplan.cost.stages.add_block`):

    time_i   = fwd + bwd + tp_fwd + tp_bwd + ep_fwd + ep_bwd + cp_fwd + cp_bwd  + r x (fwd + tp_fwd + ep_fwd
               + cp_fwd under full recomputation, the re-run nodes' time + tp_fwd + cp_fwd under selective)
    act_i    = saved bytes (none), saved less the dropped matmul outputs (selective), block input (full)
    static_i = parameters_i * bytes per parameter of weights, grads and Adam state after ZeRO over the
               dp x cp ranks (cost/memory/per_device.py:model_states, Rajbhandari et al. SC'20; cost/cp/weights.py)

with r the re-runs per micro-batch (cost/pp/reruns.py): 1 where the backward runs whole, 2 where B and W split
it; the partition does not know a block's chunk, so it charges r averaged over the plan's chunks.

A cut before a block costs one send/recv of its input (D) and one of its gradient (D_g: of the input's tensors,
those with one, LayerSummary.input_grad_bytes) over the pp group, and a stage may hold the usable memory less the
communication buffers (nothing freed: an upper bound). Its boundary tensors held as buffers are one send and one
receive buffer where the runtime runs its own pipeline; where torch's ``PipelineStage`` runs it, one receive slot
per chunk and micro-batch (cost/pp/receive_slots.py), a forward one at D and a gradient one at D_g <= D, the fewest
bytes any stage holds, as one room stands for every stage: m (v - 1) forward and m v gradient slots (the first
stage, whose first chunk receives nothing; the last holds the reverse), or m of each in a V (stage 0, chunks 0 and
2p - 1; a middle one holds 2m of each less at most m of each at the V's turn). The price counts no fewer bytes on
any stage (cost/memory/plan.py, replayed.py).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Iterable

from autoplan.cost.blocks import LayerSummary
from autoplan.cost.compute.roofline import PRECISION_BYTES
from autoplan.cost.cp.weights import weight_sync_plan
from autoplan.cost.memory.in_flight_floor import KeptBytes
from autoplan.cost.memory.per_device import comm_buffer_bytes, model_states, scatter_buffer_bytes, usable_bytes
from autoplan.cost.memory.plan import torch_slots
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.pp.receive_slots import held_bytes
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.schedules import V_SCHEDULES


def block_time_s(block: LayerSummary, recompute: str, reruns: float = 1.0) -> float:
    """One micro-batch of ``block`` under ``recompute``: compute, TP and EP collectives, and ``reruns`` re-runs
    (cost/pp/reruns.py forward_reruns: two where B and W split its backward)."""
    base = block.fwd_s + block.bwd_s + block.tp_fwd_s + block.tp_bwd_s + block.ep_fwd_s + block.ep_bwd_s
    base += block.cp_fwd_s + block.cp_bwd_s
    again = (reruns - 1.0) * rerun_s(block, recompute)  # 0.0 at one re-run: the sums below as they were
    if recompute == "full":
        return base + block.fwd_s + block.tp_fwd_s + block.ep_fwd_s + block.cp_fwd_s + again
    rerun = block.selective_recompute_s + block.tp_fwd_s + block.cp_fwd_s  # the all-to-alls kept: reruns_a2a
    return base + (rerun + again if recompute == "selective" else 0.0)


def rerun_s(block: LayerSummary, recompute: str) -> float:
    """One forward re-run of ``block`` under ``recompute`` (cost/stages.py add_block): its recomputed time and
    the collectives it runs again (the all-to-alls only in full: reruns_a2a); 0 under "none"."""
    if recompute == "full":
        return block.fwd_s + block.tp_fwd_s + block.ep_fwd_s + block.cp_fwd_s
    return block.selective_recompute_s + block.tp_fwd_s + block.cp_fwd_s if recompute == "selective" else 0.0


def kept_bytes(block: LayerSummary, recompute: str) -> float:
    """The activations ``block`` keeps per micro-batch until its backward, under ``recompute``."""
    if recompute == "full":
        return block.input_bytes
    return block.saved_bytes - (block.selective_dropped_bytes if recompute == "selective" else 0.0)


def kept_of(blocks: Iterable[LayerSummary], pre: LayerSummary, post: LayerSummary, plan: Plan) -> KeptBytes:
    """:class:`KeptBytes` of the block summaries ``blocks`` and the outside nodes' ``pre`` and ``post`` under
    ``plan``'s recompute (cost/stages.py add_block: a block re-makes its saved bytes under full recompute, its
    dropped ones under selective)."""
    remade = {"full": attrgetter("saved_bytes"), "selective": attrgetter("selective_dropped_bytes")}
    blocks = list(blocks)
    return KeptBytes(
        blocks=sum(kept_bytes(b, plan.recompute) for b in blocks),
        owed=max(0.0, sum(b.wgrad_held_bytes for b in blocks) + post.wgrad_held_bytes - post.loss_saved_bytes),
        remade=min(map(remade[plan.recompute], blocks), default=0.0) if plan.recompute in remade else 0.0,
        pre=pre.saved_bytes,
        post=post.saved_bytes,
    )


def state_bytes_per_param(plan: Plan, dp: int | None = None, *, trainable: bool = True) -> float:
    """Weights + gradients + optimizer bytes per parameter sharded over ``dp`` ranks (the plan's dp
    unless given: the routed experts' are sharded over dp / ep); a frozen one's (``trainable`` False)
    weights only."""
    states = model_states(
        params=1.0,
        precision=plan.precision,
        zero_stage=plan.zero_stage,
        dp=dp or plan.dp * plan.cp,
        pp=plan.pp,
        trainable=1.0 if trainable else 0.0,
        offload=plan.offload,
    )
    return sum((states.weights_bytes, states.grads_bytes, states.optimizer_bytes))


def cut_s(profile: Profile, plan: Plan, boundary_bytes: float, grad_bytes: float) -> float:
    """A cut's one send/recv of the activation, ``boundary_bytes``, and one of its gradient, ``grad_bytes``."""
    if plan.pp == 1:
        return 0.0
    group = mesh_groups(profile, dp=plan.dp, tp=plan.tp, pp=plan.pp, cp=plan.cp)["pp"]
    forward = collective_time_s(profile, "send_recv", boundary_bytes, group=group)
    return forward + collective_time_s(profile, "send_recv", grad_bytes, group=group)


def stage_capacity_bytes(
    profile: Profile, plan: Plan, *, boundary_bytes: float, grad_bytes: float, block_params: float
) -> float:
    """The bytes one stage's blocks may hold: usable memory less the communication buffers, ``boundary_bytes`` D
    and ``grad_bytes`` D_g the largest block input and its gradients (module docstring)."""
    plan = weight_sync_plan(plan)  # ZeRO's buffers are sharded over dp x cp
    buffers = comm_buffer_bytes(
        zero_stage=plan.zero_stage,
        dp=plan.dp,
        pp=1,  # the boundary tensors: receive_buffers
        boundary_bytes=boundary_bytes,
        block_params=block_params,
        precision=plan.precision,
    )
    forward, grads = receive_buffers(plan)
    buffers += held_bytes(forward, grads, boundary_bytes=boundary_bytes, grad_bytes=grad_bytes)
    buffers += scatter_buffer_bytes(
        zero_stage=plan.zero_stage,
        dp=plan.dp,
        pp=plan.pp,
        block_params=block_params,
        precision=plan.precision,
        reduce_bytes=PRECISION_BYTES[plan.grad_reduce_dtype],
    )  # nothing freed: an upper bound
    return usable_bytes(profile.device.memory_bytes) - buffers


def receive_buffers(plan: Plan) -> tuple[int, int]:
    """(boundary tensors, their gradients) a stage holds as buffers, the fewest bytes of any stage (module
    docstring)."""
    if plan.pp == 1:
        return 0, 0
    if not torch_slots(plan):
        return 2, 0  # one send and one receive buffer, each D (cost/memory/per_device.py comm_buffer_bytes)
    m, v = plan.num_microbatches, plan.virtual_stages
    return (m, m) if plan.schedule in V_SCHEDULES else (m * (v - 1), m * v)
