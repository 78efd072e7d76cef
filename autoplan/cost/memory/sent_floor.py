"""A floor on a plan's peak memory from the boundary tensors torch's runtime holds until the step's end (docs/ilp.md,
"Memory floor"), so the search sets aside, unpriced, a replayed pipeline plan whose sends alone cannot fit.

Where a stage's peak is its replayed order's (cost/memory/replayed.py), its moment M2 (cost/memory/per_device.py
stage_memory) counts the state of its order holding the most bytes, sum_j (h_j S_j + k_j K_j) + sent D_k + loss L,
with every weight >= 0; that state holds at least as many bytes as the one with the most tensors sent, so

    peak_k >= W_k + G_k + O_k + n_k D_k

with n_k the most boundary tensors rank k's states hold at once (replayed.py ``most_sent``: sends finished but not
waited, and the receive slots) and D_k the stage's boundary tensor: the input of the first block of a chunk of
index > 0, received whole on every tp rank (cost/stages.py), so D_k >= D, the smallest input of a block after the
first; stage 0 of a one-chunk pipeline receives none (n_0 D_0 counted 0). The largest of the pp devices is at least
their mean and at least each one, so

    peak >= max((sum_k states_k + D sum_k n_k) / pp,  D max_k n_k)

with sum_k states_k at least the blocks' model states (in_flight_floor.py ``blocks_states_bytes``, and the routed
experts', experts_floor.py): none depends on the partition. Measured on GPT-1T on 3,072 A100s, the sends alone exceed
the device in most pipelined plans that the search used to price for their memory alone and find over it; the search
holds such a plan back unpriced (solve/search.py ``Search._held_back``; docs/ilp.md).
"""

from __future__ import annotations

from typing import Any, Callable

from autoplan.cost.memory.in_flight_floor import blocks_states_bytes, schedule_key
from autoplan.cost.memory.replayed import most_sent, replays_memory
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan
from autoplan.types.schedules import V_SCHEDULES


def sent_counts(plan: Plan) -> tuple[int, ...] | None:
    """n_k of the module docstring per stage (0 where the stage receives nothing); None where ``plan``'s memory is
    not replayed. Reads only the plan's schedule key (in_flight_floor.py ``schedule_key``)."""
    if not replays_memory(plan):
        return None
    receives = [k > 0 or plan.virtual_stages > 1 or plan.schedule in V_SCHEDULES for k in range(plan.pp)]
    return tuple(most_sent(plan, k) if receives[k] else 0 for k in range(plan.pp))


def sent_floor_bytes(plan: Plan, *, states_bytes: float, boundary_bytes: float, sent: tuple[int, ...]) -> float:
    """The module docstring's floor, bytes per device: ``states_bytes`` the blocks' model states per device summed
    over the stages' devices, ``boundary_bytes`` D, ``sent`` :func:`sent_counts` of ``plan``."""
    return max((states_bytes + boundary_bytes * sum(sent)) / plan.pp, boundary_bytes * max(sent))


class SendsFloor:
    """:func:`sent_floor_bytes` of a plan under any partition, from what the search's bounds read of its blocks
    (``stage_costs``: cost/bounds.py StageFacts; ``trained_floor``: Bounds.trained_floor; ``experts_bytes``: the
    routed experts' states summed over a plan's stages, experts_floor.py); the counts memoised per schedule key, the
    least block input per block summaries."""

    def __init__(
        self, stage_costs: Any, trained_floor: Callable[[float], float], experts_bytes: Callable[[Plan], float]
    ):
        self.stage_costs, self.trained_floor, self.experts_bytes = stage_costs, trained_floor, experts_bytes
        self._sent: dict[tuple, tuple[int, ...] | None] = {}
        self._inputs: dict[int, tuple[Any, float]] = {}  # by the summaries' identity, holding them

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
        whole = plan.tp if plan.sequence_parallel and plan.tp > 1 else 1  # received whole on each tp rank
        boundary = whole * self._least_input_bytes(plan)
        return sent_floor_bytes(plan, states_bytes=states, boundary_bytes=boundary, sent=sent)

    def _least_input_bytes(self, plan: Plan) -> float:
        """D: the smallest input of a block after the first, at floor_context's activation bytes (a floor of every
        run dtype of the plan's ZeRO variants, solve/stage_costs.py)."""
        ctx = self.stage_costs.floor_context(plan)
        summaries = self.stage_costs.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
        if (hit := self._inputs.get(id(summaries))) is None or hit[0] is not summaries:
            least = min((b.input_bytes for b in list(summaries.values())[1:]), default=0.0)
            self._inputs[id(summaries)] = hit = (summaries, least)
        return hit[1]
