"""The receive slots a pipeline rank holds beside its chunks' activations, as torch's ``PipelineStage`` keeps
them (torch 2.13 stage.py; docs/cost-model.md, "Pipeline memory": the receive slots).

Every chunk c of the rank keeps, per micro-batch, a forward slot for its input (c > 0) and a gradient slot for
its output's gradient (c < last), from the first step on and for the whole run: a buffer each ``irecv`` fills in
place, or at the V's turn (chunks p - 1 and p on one rank) the neighbour's own tensor (``set_local_fwd_input``,
``set_local_bwd_input``), left there until the next step replaces it. The activations do not count a slot: the
tracer gives a saved tensor to the node that made it (a chunk's input is its sender's output, cost/blocks.py),
and a chunk's own output is in its activations from its F to its W (or whole backward BW), then held by its send
to the step's end (cost/pp/rank_memory.py ``sent``). Only at the turn is one tensor both: chunk p's forward slot
holds chunk p - 1's output, which chunk p - 1's activations count until its W, and chunk p - 1's gradient slot
holds chunk p's input gradient, which rank_memory counts as sent from chunk p's B. So, added to ``sent``,

    at the step's start   m (chunks with c > 0) forward, m (chunks with c < last) gradient slots
    F of chunk p - 1      - 1    (its output is in the slot and in its activations)
    W or BW of p - 1      + 1 - 1 (the slot's again; rank_memory's count of the output sent, taken back)
    B or BW of chunk p    - 1    (rank_memory's count of the input gradient sent, taken back: a gradient one)

A forward slot weighs its chunk's input D_in, a gradient slot its output's gradients D_g,out (the next chunk's
input that requires grad: stage.py ``_create_grad_recv_info`` reads the next stage's, ``buffer=... if grad_meta
else None``; docs/cost-model.md, "A boundary's gradients weigh D_g"), a send of the output D_out and of the input
gradient D_g,in (cost/stages.py ``held_boundary_bytes``). Grad slots hold a received tensor no kept gradient is.
"""

from __future__ import annotations

from autoplan.cost.stored import stored
from autoplan.types.layout import chunks_of_stage
from autoplan.types.schedules import V_SCHEDULES

Slots = tuple[int, int]  # (forward slots, each one boundary tensor D; gradient slots, each its gradients D_g)


@stored(maxsize=None)  # one per (schedule, pp, v, m, rank), as rank_memory.rank_states
def slot_changes(*, schedule: str, pp: int, virtual_stages: int, m: int, rank: int) -> tuple[Slots, dict]:
    """(the rank's receive slots at the step's start, {(kind, chunk): change} to add to rank_memory's sent counts
    after each action half), each as (forward slots, gradient slots) (module docstring)."""
    v_shape = schedule in V_SCHEDULES
    chunks, last = chunks_of_stage(rank, pp=pp, virtual_stages=virtual_stages, v_shape=v_shape), pp * virtual_stages - 1
    start = (m * sum(c > 0 for c in chunks), m * sum(c < last for c in chunks))
    turn = [c for c in chunks if c + 1 in chunks]  # the V's turn: chunk p - 1 beside chunk p
    changes = {(kind, c + 1): (0, -1) for c in turn for kind in ("B", "BW")}
    return start, {**changes, **{("F", c): (-1, 0) for c in turn}}


def single_chunk_slots(*, pp: int, m: int, rank: int) -> Slots:
    """Receive slots stage ``rank`` of torch's ``Schedule1F1B`` or ``ScheduleGPipe`` holds beside its activations
    (module docstring): m forward slots for its input (rank > 0) and m gradient slots for its output's gradient
    (rank < pp - 1: stage 0 holds stage 1's input gradients, the last stage none)."""
    return m * (rank > 0), m * (rank < pp - 1)


def held_bytes(sent: int, grads: int, *, boundary_bytes: float, grad_bytes: float) -> float:
    """The bytes of ``sent`` boundary tensors (and forward slots) at D and ``grads`` of their gradients (and gradient
    slots) at D_g <= D (module docstring), as (sent + grads) D_g + sent (D - D_g): one product where D_g = D."""
    return (sent + grads) * grad_bytes + sent * (boundary_bytes - grad_bytes)
