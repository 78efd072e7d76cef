"""What a pipeline sends between its stages: the one statement the time terms and the audit read.

Each chunk but the first receives its first block's inputs once per micro-batch, one message per
tensor; each chunk but the first sends back the gradient of those inputs that need one (rotary
tables and masks made before the first block travel forward only). Under TP a runtime with
``pp_scatter_gather`` (types/runtime.py: autoplan's executor, Megatron-Core) sends 1/tp of a floating
tensor from each tp rank and the receiver all-gathers it over the tp group (Narayanan et al. SC'21
section 4.1; autoplan/execute/pipeline_scatter.py); the gradient goes back as 1/tp and the sender
all-gathers it. Under sequence parallelism a tensor split along the sequence stays so on arrival:
nothing is gathered. Which tensors split, and along which dim, is types/layout.pipeline_scatter_dim.
Without it every tp rank sends the whole tensor; under SP a stage then first all-gathers its
sequence-sharded boundary (its largest tensor), and the gradient of its input before sending it back.
The step time (CostModel._time) charges each of the (v m + p - 1) slots of the schedule the
largest chunk boundary, forward and back, with its gathers; the audit (cost/volumes.py) counts
every send, receive and gather of each stage (docs/cost-model.md, "Pipeline sends under TP"). In a V
(types/layout.py) the turn's chunks share the last stage: that boundary is handed over locally, unsent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cost.compute.dtypes import RunDtypes, dtype_policy, dtypes_of
from autoplan.cost.compute.roofline import activation_scale
from autoplan.cost.dp.messages import StepMessages
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.types.graph import Graph, OpNode
from autoplan.types.layout import chunks_of_stage, kept_sharded, pipeline_scatter_dim, sent_from_prior
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.runtime import runtime_named
from autoplan.types.schedules import v_shaped

#: where a boundary's tp all-gather runs: on the stage that sends the tensor, or the one receiving it
SENDER, RECEIVER = "sender", "receiver"


@dataclass(frozen=True)
class Boundary:
    """What one chunk receives per micro-batch: bytes of each tensor one tp rank sends forward
    (``sent``), of each gradient it sends back (``returned``), and each tp all-gather with the
    whole tensor's bytes and the stage that runs it (``gathers``), in the plan's activation dtype."""

    sent: list[float]
    returned: list[float]
    gathers: tuple[tuple[float, str], ...] = ()


#: per chunk, what it receives per micro-batch
ChunkInputs = list[Boundary]


def block_inputs(graph: Graph, inputs: list[OpNode], plan: Plan, *, dtypes: RunDtypes | None = None) -> Boundary:
    """What a chunk starting at a block whose inputs are ``inputs`` receives per micro-batch
    (module docstring), each tensor in its run dtype (``dtypes``, compute/dtypes.py: the fp32
    residual stream of an autocast run), else in the plan's precision."""
    grads = graph.grad_nodes()
    scale = plan.micro_batch_size / graph.batch_size / plan.cp  # a cp rank holds 1/cp of every sequence
    scatter = plan.tp > 1 and runtime_named(plan.runtime).pp_scatter_gather
    sent, returned, gathers = [], [], []
    for n in inputs:
        size = n.output_bytes * scale * activation_scale(n, precision=plan.precision, dtypes=dtypes)
        grad = n.name in grads
        dim = _scatter_dim(n, plan) if scatter else None
        share = size / plan.tp if dim is not None else size
        sent.append(share)
        returned += [share] if grad else []
        if dim is not None and not kept_sharded(dim, sequence_parallel=plan.sequence_parallel):
            gathers += [(size, RECEIVER)] + ([(size, SENDER)] if grad else [])
    if not scatter and plan.sequence_parallel and plan.tp > 1:
        gathers += [(max(sizes), where) for sizes, where in ((sent, SENDER), (returned, RECEIVER)) if any(sizes)]
    return Boundary(sent, returned, tuple(gathers))


class BoundaryMemo:
    """:func:`block_inputs` of a block, memoised on its group (``inputs_of``: block -> (group, the group's block
    inputs)) and what the function reads of a plan: micro-batch, cp, tp, runtime, precision, sequence split and
    dtype policy (the run dtypes; none ``in_precision``). Thousands of priced plans share a few of these."""

    def __init__(self, graph: Graph, backend: str, inputs_of: dict[str, tuple[str, list[OpNode]]]):
        self.graph, self.backend, self.inputs_of = graph, backend, inputs_of
        self._memo: dict[tuple, Boundary] = {}

    def get(self, layers: list[str], plan: Plan, *, in_precision: bool = False) -> list[Boundary]:
        """:func:`block_inputs` of each of ``layers`` under ``plan``."""
        policy = None if in_precision else dtype_policy(plan, backend=self.backend)
        reads = (plan.micro_batch_size, plan.cp, plan.tp, plan.runtime, plan.precision, plan.sequence_parallel, policy)
        found = []
        for layer in layers:
            group, inputs = self.inputs_of[layer]
            hit = self._memo.get(key := (group, *reads))
            if hit is None:
                hit = self._memo[key] = block_inputs(self.graph, inputs, plan, dtypes=dtypes_of(self.graph, policy))
            found.append(hit)
        return found


def _scatter_dim(node: OpNode, plan: Plan) -> int | None:
    floating, sp = "float" in node.output_dtype, plan.sequence_parallel
    return pipeline_scatter_dim(node.output_shape, floating=floating, tp=plan.tp, sequence_parallel=sp)


def slot_bytes(chunks: ChunkInputs) -> tuple[float, float]:
    """The largest boundary any chunk receives and sends back per tp rank, per micro-batch: what
    one slot of the schedule sends on the critical path, forward and backward."""
    received = chunks[1:]
    return max(sum(b.sent) for b in received), max(sum(b.returned) for b in received)


def slot_gathers(chunks: ChunkInputs) -> list[float]:
    """The tp all-gathers of the boundary with the most gathered bytes (whole bytes of each)."""
    return max(([size for size, _ in b.gathers] for b in chunks[1:]), key=sum)


def stage_sends(chunks: ChunkInputs, plan: Plan, stage: int) -> list[StepMessages]:
    """Stage ``stage``'s sends and receives per step, chunk by chunk (module docstring)."""
    last, m, found = len(chunks) - 1, plan.num_microbatches, []
    sent = _sent_from_prior(plan)  # the V's turn hands over on its stage (types/layout.py)
    for c in _stage_chunks(plan, stage):
        if c < last and sent(c + 1):  # what the next chunk receives, and the gradients of those that need one back
            forward, backward = chunks[c + 1].sent, chunks[c + 1].returned
            found += [StepMessages("send", m * len(forward), m * sum(forward))]
            found += [StepMessages("recv", m * len(backward), m * sum(backward))]
        if sent(c):
            forward, backward = chunks[c].sent, chunks[c].returned
            found += [StepMessages("recv", m * len(forward), m * sum(forward))]
            found += [StepMessages("send", m * len(backward), m * sum(backward))]
    return found


def _stage_chunks(plan: Plan, stage: int) -> list[int]:
    """The chunks ``stage`` runs, in the plan's placement (types/layout.py)."""
    return chunks_of_stage(stage, pp=plan.pp, virtual_stages=plan.virtual_stages, v_shape=v_shaped(plan.schedule))


def _sent_from_prior(plan: Plan) -> Callable[[int], bool]:
    """Whether chunk c's input crosses stages under the plan's placement (False at the V's turn)."""
    return functools.partial(sent_from_prior, pp=plan.pp, v_shape=v_shaped(plan.schedule))


def boundary_gathers(chunks: ChunkInputs, plan: Plan, stage: int) -> list[StepMessages]:
    """Stage ``stage``'s tp all-gathers of pipeline boundaries per step: those of the boundaries
    it sends (as their sender) and of those it receives (as their receiver)."""
    last, m, found = len(chunks) - 1, plan.num_microbatches, []
    sent = _sent_from_prior(plan)
    for c in _stage_chunks(plan, stage):
        mine = [(chunks[c + 1], SENDER)] if c < last and sent(c + 1) else []
        mine += [(chunks[c], RECEIVER)] if sent(c) else []
        for boundary, role in mine:
            sizes = [size for size, where in boundary.gathers if where == role]
            found += [StepMessages("all_gather", m * len(sizes), m * sum(sizes))] if sizes else []
    return found


def pipeline_sends_s(
    profile: Profile, plan: Plan, chunks: ChunkInputs, *, group: AxisGroup, tp_group: AxisGroup
) -> float:
    """Sends on the critical path, one activation and one gradient per chunk slot, with the
    boundary's tp all-gathers (1/tp per tp rank, gathered on arrival, where the plan's runtime
    scatters; whole tensors, gathered before sending under SP, where not); gradients go back only
    for tensors that need one:

        t = (v m + p - 1) * (t_send(fwd) + t_send(bwd) + sum t_all_gather(g) over the slot's gathers)
    """
    if plan.pp == 1:
        return 0.0
    forward, backward = slot_bytes(chunks)
    t_slot = sum(collective_time_s(profile, "send_recv", size, group=group) for size in (forward, backward) if size)
    gathers = [size for size in slot_gathers(chunks) if size]
    t_slot += sum(collective_time_s(profile, "all_gather", size, group=tp_group) for size in gathers)
    return (plan.virtual_stages * plan.num_microbatches + plan.pp - 1) * t_slot
