"""A floor on a plan's peak memory from the boundary tensors torch's runtime holds until the step's end (docs/ilp.md,
"Memory floor"), so the search sets aside, unpriced, a replayed pipeline plan whose sends alone cannot fit.

Where a stage's peak is its replayed order's (cost/memory/replayed.py), its moment M2 (cost/memory/per_device.py
stage_memory) counts the state of its order holding the most bytes, sum_j (h_j S_j + k_j K_j) + sent D_k + loss L,
with every weight >= 0; that state holds at least as many bytes as the one with the most tensors sent, so

    peak_k >= W_k + G_k + O_k + max(n_k D_g,  f_k D)

with n_k the most boundary tensors and gradients rank k's states hold at once, f_k the most boundary tensors
(replayed.py ``most_sent``: sends finished but not waited, and the receive slots), D_k the larger of the stage's
input and output: the input of the first block of a chunk of index > 0, received whole on every tp rank
(cost/stages.py ``held_boundary_bytes``), so D_k >= D, the smallest input of a block after the first, and its
gradients D_g,k >= D_g, the smallest of theirs (a state's bytes f D_k + g D_g,k with D_k >= D_g,k: at least
(f + g) D_g and f D); stage 0 too, whose outputs and gradient slots weigh its output's. The largest of the pp
devices is at least their mean and at least each one, so

    peak >= max((sum_k states_k + max(D_g sum_k n_k, D sum_k f_k)) / pp,  D_g max_k n_k,  D max_k f_k)

with sum_k states_k at least the blocks' model states (in_flight_floor.py ``blocks_states_bytes``, and the routed
experts', experts_floor.py): none depends on the partition. A torch-run 1F1B or GPipe stage (not replayed) holds its
receive slots in every moment's buffers (plan.py ``_single_chunk_slots``): f_k forward slots at D_in,k >= D and g_k
gradient slots at D_g,out >= D_g (cost/pp/receive_slots.py), so the same floor holds with n_k = f_k + g_k. The
search holds a plan over it back unpriced (solve/search.py ``Search._held_back``; docs/ilp.md, "The sends floor").
"""

from __future__ import annotations

from typing import Any, Callable

from autoplan.cost.memory.in_flight_floor import blocks_states_bytes, schedule_key
from autoplan.cost.memory.plan import torch_slots
from autoplan.cost.memory.replayed import most_sent, replays_memory
from autoplan.cost.pp.receive_slots import single_chunk_slots
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan


def sent_counts(plan: Plan) -> tuple[tuple[int, int], ...] | None:
    """(n_k, f_k) of the module docstring per stage: of its replayed order, or of a torch-run 1F1B's or GPipe's
    receive slots (f_k forward slots and g_k gradient slots, n_k = f_k + g_k: receive_slots.py
    ``single_chunk_slots``); None where torch's runtime does not run the pipeline. Reads only the plan's schedule key
    (in_flight_floor.py ``schedule_key``)."""
    if replays_memory(plan):
        return tuple(most_sent(plan, k) for k in range(plan.pp))
    if not torch_slots(plan):
        return None
    slots = (single_chunk_slots(pp=plan.pp, m=plan.num_microbatches, rank=k) for k in range(plan.pp))
    return tuple((forward + grads, forward) for forward, grads in slots)


def sent_floor_bytes(
    plan: Plan, *, states_bytes: float, boundary_bytes: float, grad_bytes: float, sent: tuple[tuple[int, int], ...]
) -> float:
    """The module docstring's floor, bytes per device: ``states_bytes`` the blocks' model states per device summed
    over the stages' devices, ``boundary_bytes`` D, ``grad_bytes`` D_g, ``sent`` :func:`sent_counts` of ``plan``."""
    both, forward = [n for n, _ in sent], [f for _, f in sent]
    summed = max(grad_bytes * sum(both), boundary_bytes * sum(forward))
    return max((states_bytes + summed) / plan.pp, grad_bytes * max(both), boundary_bytes * max(forward))


class SendsFloor:
    """:func:`sent_floor_bytes` of a plan under any partition, from what the search's bounds read of its blocks
    (``stage_costs``: cost/bounds.py StageFacts; ``trained_floor``: Bounds.trained_floor; ``experts_bytes``: the
    routed experts' states summed over a plan's stages, experts_floor.py); the counts memoised per schedule key, the
    least block input per block summaries."""

    def __init__(
        self, stage_costs: Any, trained_floor: Callable[[float], float], experts_bytes: Callable[[Plan], float]
    ):
        self.stage_costs, self.trained_floor, self.experts_bytes = stage_costs, trained_floor, experts_bytes
        self._sent: dict[tuple, tuple[tuple[int, int], ...] | None] = {}
        self._inputs: dict[int, tuple[Any, tuple[float, float]]] = {}  # by the summaries' identity, holding them

    def floor_bytes(self, plan: Plan) -> float:
        """The module docstring's floor, bytes per device; 0 where ``plan``'s memory is not replayed. Of one schedule
        step, as the memory is (types/schedule_steps.py)."""
        plan = schedule_step_plan(plan)
        if (key := schedule_key(plan)) not in self._sent:
            self._sent[key] = sent_counts(plan)
        if (sent := self._sent[key]) is None:
            return 0.0
        _, _, blocks = self.stage_costs.param_parts(plan)
        states = blocks_states_bytes(plan, block_params=blocks, trained=self.trained_floor(blocks))
        states += self.experts_bytes(plan)
        boundary, grads = self.boundary_bytes(plan)
        return sent_floor_bytes(plan, states_bytes=states, boundary_bytes=boundary, grad_bytes=grads, sent=sent)

    def slots_bytes(self, plan: Plan) -> float:
        """The fewest bytes of receive slots any device of ``plan`` holds where torch's runtime runs its 1F1B or GPipe
        (cost/memory/plan.py ``_single_chunk_slots``, not replayed: the replayed count theirs above): every stage m
        forward slots (rank > 0, each its input, D_in >= D >= D_g) or m gradient slots (rank < pp - 1, each its
        output's gradients, D_g,out >= D_g), so m D_g on each (``plan`` of one schedule step). In every stage's M2
        beside the terms the other floors bound (cost/memory/per_device.py stage_memory: its buffers), so added to
        them (Bounds.memory_floor_bytes); 0 for every other plan."""
        if not torch_slots(plan) or replays_memory(plan):
            return 0.0
        return plan.num_microbatches * self.boundary_bytes(plan)[1]

    def boundary_bytes(self, plan: Plan) -> tuple[float, float]:
        """(D, D_g) of the module docstring: the least input of a block after the first and its gradients, whole on
        each tp rank where sequence parallelism splits them (received whole)."""
        whole = plan.tp if plan.sequence_parallel and plan.tp > 1 else 1
        boundary, grads = self._least_input_bytes(plan)
        return whole * boundary, whole * grads

    def _least_input_bytes(self, plan: Plan) -> tuple[float, float]:
        """(D, D_g): the smallest input of a block after the first and the smallest of its gradients, at
        floor_context's activation bytes (a floor of every run dtype of the plan's ZeRO variants,
        solve/stage_costs.py)."""
        ctx = self.stage_costs.floor_context(plan)
        summaries = self.stage_costs.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
        if (hit := self._inputs.get(id(summaries))) is None or hit[0] is not summaries:
            after = list(summaries.values())[1:]
            least = (
                min((b.input_bytes for b in after), default=0.0),
                min((b.input_grad_bytes for b in after), default=0.0),
            )
            self._inputs[id(summaries)] = hit = (summaries, least)
        return hit[1]
