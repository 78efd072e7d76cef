"""What a pipeline sends between its stages: the one statement the time terms and the audit read.

Each chunk but the first receives its first block's inputs once per micro-batch, whole on every
tp rank (the executor gathers a stage's DTensor output, autoplan/execute/tensor_parallel.py), one
message per tensor; each chunk but the first sends back the gradient of those inputs that need
one (rotary tables and masks made before the first block travel forward only). Under sequence
parallelism a stage first all-gathers its sequence-sharded boundary over the tp group. The step
time (CostModel._pp_comm_s) charges each of the (v m + p - 1) slots of the schedule the largest
chunk boundary, forward and back; the audit
(cost/volumes.py) counts every send and receive of each stage.
"""

from __future__ import annotations

from autoplan.cost.compute.roofline import activation_scale
from autoplan.cost.dp.messages import StepMessages
from autoplan.types.graph import Graph, OpNode
from autoplan.types.layout import chunks_of_stage
from autoplan.types.plan import Plan

#: per chunk, (bytes of each tensor it receives, bytes of each whose gradient goes back), per micro-batch
ChunkInputs = list[tuple[list[float], list[float]]]


def block_inputs(graph: Graph, inputs: list[OpNode], plan: Plan) -> tuple[list[float], list[float]]:
    """What a chunk starting at a block whose inputs are ``inputs`` receives per micro-batch:
    (bytes of each, bytes of each whose gradient goes back), in the plan's activation dtype."""
    grads = graph.grad_nodes()
    scale = plan.micro_batch_size / graph.batch_size / plan.cp  # a cp rank holds 1/cp of every sequence
    sizes = [(n.output_bytes * scale * activation_scale(n, precision=plan.precision), n.name in grads) for n in inputs]
    return [b for b, _ in sizes], [b for b, g in sizes if g]


def slot_bytes(chunks: ChunkInputs) -> tuple[float, float]:
    """The largest boundary any chunk receives and sends back, per micro-batch: what one slot of
    the schedule sends on the critical path, forward and backward."""
    received = chunks[1:]
    return max(sum(f) for f, _ in received), max(sum(b) for _, b in received)


def stage_sends(chunks: ChunkInputs, plan: Plan, stage: int) -> list[StepMessages]:
    """Stage ``stage``'s sends and receives per step, chunk by chunk (module docstring)."""
    last, m, found = len(chunks) - 1, plan.num_microbatches, []
    for c in chunks_of_stage(stage, pp=plan.pp, virtual_stages=plan.virtual_stages):
        if c < last:  # what the next chunk receives, and the gradients of those that need one back
            forward, backward = chunks[c + 1]
            found += [StepMessages("send", m * len(forward), m * sum(forward))]
            found += [StepMessages("recv", m * len(backward), m * sum(backward))]
        if c > 0:
            forward, backward = chunks[c]
            found += [StepMessages("recv", m * len(forward), m * sum(forward))]
            found += [StepMessages("send", m * len(backward), m * sum(backward))]
    return found


def sp_boundary_gathers(chunks: ChunkInputs, plan: Plan, stage: int) -> list[StepMessages]:
    """Under sequence parallelism a stage gathers its sequence-sharded output before sending it,
    and the gradient of its input before sending that back: one tp all-gather of the boundary
    (its largest tensor) each, per micro-batch."""
    if plan.pp == 1 or not plan.sequence_parallel:
        return []
    m, found = plan.num_microbatches, []
    for c in chunks_of_stage(stage, pp=plan.pp, virtual_stages=plan.virtual_stages):
        sent = [chunks[c + 1][0]] if c < len(chunks) - 1 else []  # the activations leaving the chunk
        returned = [chunks[c][1]] if c > 0 else []  # the input gradients going back
        for sizes in sent + returned:
            big = [b for b in sizes if b > 0]
            found.append(StepMessages("all_gather", m * len(big[:1]), m * max(big, default=0.0)))
    return found
