"""A floor on the peak of a plan whose stages are known: cost/memory/in_flight_floor.py's per-device bound read
on the plan's own partition, not weighted over every partition (docs/ilp.md, "Memory floor").

On every pipeline device k, CostModel's peak is at least its moment M2 (cost/memory/per_device.py stage_memory):

    peak >= max_k ( states(P_k) + n'_k S_k + p_k D_k + C_k ) + R + B

with P_k the dense parameters of the blocks device k holds (and the nodes before the first block on device 0, those
after the last on the loss's device, as StageCosts.stage_totals places them, their saved activations in S_k; R and
B in_flight_floor.py's and sent_floor.py's, on every device; C_k device k's boundary tensors at its counts' state,
in_flight_floor.device_sent), states() their model states at the
fewest of them trainable (Bounds.trained_floor), n'_k and p_k device k's micro-batches in flight after its first
backward and W owed (in_flight_floor.device_counts), S_k and D_k its blocks' kept activations and kept output
gradients per micro-batch at floor_context (StageCosts.kept_bytes_total's terms, block by block); a replayed stage's
counts (V schedules too) the fewest its chunks hold at its fullest state, whatever they weigh (held_floor). Where the
search may price the plan with its activations on the host, the states alone. The harmonic floor spreads the
activations over ~ln(pp) devices' worth; this one reads the fullest device's own. Pass._price_held prices the plans
held for the TP retry in order of the larger of the two (:func:`floor_order`), so it prices fewer
(tests/unit/solve/test_held_floor_order.py checks it below every priced peak, and the retry's start unchanged).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Iterator

from autoplan.cost import blocks_states_bytes, device_counts, device_sent, kept_bytes, schedule_key, sent_bytes
from autoplan.solve import activation_offload, moe_overlap
from autoplan.types.plan import Plan
from autoplan.types.schedule_steps import schedule_step_plan
from autoplan.types.schedules import plan_chunk_stages, plan_last_stage, v_shaped


def floor_order(search: Any, held: list) -> Iterator[tuple[float, int]]:
    """(:func:`least_floor`, index) of each of ``held``'s plans in increasing order, each floor read only once every
    plan of a lesser :func:`held_floor` (its lower bound) is read: the pass stops at the first floor above its
    least peak, so most floors on the plans' own stages are never read (GPT-1T on 3,072: ~6,800 held plans)."""
    lower = [held_floor(search, item) for item in held]
    order, ready, taken = sorted(range(len(held)), key=lambda i: (lower[i][0], i)), [], 0
    while taken < len(order) or ready:
        while taken < len(order) and (not ready or lower[order[taken]][0] <= ready[0][0]):  # ties read too
            i, taken = order[taken], taken + 1
            heapq.heappush(ready, (least_floor(search, held[i], lower[i][1]), i))
        yield heapq.heappop(ready)


def held_floor(search: Any, item: tuple) -> tuple[float, tuple]:
    """The least held floor of what pricing a held plan (``item``: floor, plan, bound, why) prices, at most its
    :func:`least_floor`: the plan's, and its all-to-all's overlapped twin's where it has one (Search._evaluate
    prices that beside it); and (the twin, its held floor), or None, for :func:`least_floor`."""
    floor, plan = item[0], item[1]
    if (twin := moe_overlap.overlapped_twin(plan, search.fixes)) is None:
        return floor, None
    twin_floor = search.held_floor_bytes(twin)[0]
    return min(floor, twin_floor), (twin, twin_floor)


def least_floor(search: Any, item: tuple, twin: tuple | None) -> float:
    """:func:`held_floor`, each of the plan's and its twin's floors the larger of its held floor and its floor on
    its own stages (solve/stage_floor.py); ``twin``: (the twin, its held floor) or None."""
    floor = max(item[0], search.stage_floors.floor_bytes(item[1]))
    if twin is None:
        return floor
    return min(floor, max(twin[1], search.stage_floors.floor_bytes(twin[0])))


class StageFloors:
    """:func:`stage_floor_bytes` of plans of one search, its per-block numbers memoised per tp_plan and context, and
    each device's sums of them per partition (:meth:`_devices`)."""

    def __init__(self, search: Any) -> None:
        self.search = search
        self._at = {layer: i for i, layer in enumerate(search.graph.layers)}  # a block's place in the graph
        self._counts: dict[tuple, list | None] = {}  # device_counts by schedule_key
        self._device_sent: dict[tuple, list] = {}  # device_sent by schedule_key
        self._blocks: dict[tuple, tuple] = {}  # (tp_plan id, context, recompute, overlap) -> (tp_plan, sums)
        self._sums: dict[tuple, tuple] = {}  # (stages id, _per_block's key, placement) -> (stages, devices)

    def floor_bytes(self, plan: Plan) -> float:
        """The module docstring's floor of ``plan`` (its stages set), bytes per device; 0 without stages. The
        model states are linear in the parameters and the trainable ones (cost/memory/per_device.py model_states),
        so each device's are one parameter's coefficients times its counts."""
        if not plan.stages:
            return 0.0
        plan, s = schedule_step_plan(plan), self.search
        if (devices := self._devices(plan)) is None:  # not runs of the graph's blocks (the search's never are)
            return 0.0
        counts = None
        if not (plan.offload_activations or activation_offload.may_offload(plan, s.profile, s.fixes)):
            if (key := schedule_key(plan)) not in self._counts:
                self._counts[key] = device_counts(plan, every_schedule=True)
            counts = self._counts[key]
        weights = blocks_states_bytes(plan, block_params=1.0, trained=0.0)  # per parameter
        trained = blocks_states_bytes(plan, block_params=1.0, trained=1.0) - weights  # per trainable one
        floor, trained_floor = 0.0, s.bounds.trained_floor
        sent = self._sent_bytes(plan) if counts else [0.0] * plan.pp
        for k, (held, kept, wgrad) in enumerate(devices):
            n, p = counts[k] if counts else (0.0, 0.0)
            floor = max(floor, weights * held + trained * trained_floor(held) + n * kept + p * wgrad + sent[k])
        if not counts:
            return floor
        remade = 0.0 if plan.recompute_blocks else s.stage_costs.kept_bytes_total(plan).remade
        return floor + remade + s.bounds.sends.slots_bytes(plan)  # on every device (in_flight_floor.py, R and B)

    def _sent_bytes(self, plan: Plan) -> list[float]:
        """Each device's boundary tensors at its counts' state (in_flight_floor.py device_sent), at D and D_g."""
        if (key := schedule_key(plan)) not in self._device_sent:
            self._device_sent[key] = device_sent(plan)
        boundary = self.search.bounds.sends.boundary_bytes(plan)
        return [sent_bytes(counts, boundary) for counts in self._device_sent[key]]

    def _devices(self, plan: Plan) -> list | None:
        """Each device's (dense parameters, kept bytes, kept output gradients) of ``plan``'s blocks on its stages,
        the parameters before the first block on device 0 and after the last on the loss's; None where a chunk is
        not a run of the graph's blocks. Memoised on what it reads: the stages (a partition's list, held, so its id
        stays its own; the ZeRO and sync variants of a stage option share it), :meth:`_per_block`'s key and the
        chunks' placement (pp, whether V-shaped, the loss's stage), not the ZeRO stage, sync or micro-batches
        (tests/unit/solve/test_member_floors.py varies them)."""
        block_key, sums, outside = self._per_block(plan)
        key = (id(plan.stages), block_key, plan.pp, v_shaped(plan.schedule), plan_last_stage(plan))
        hit = self._sums.get(key)
        if hit is None or hit[0] is not plan.stages:
            hit = self._sums[key] = (plan.stages, self._summed(plan, sums, outside))
        return hit[1]

    def _summed(self, plan: Plan, sums: tuple, outside: tuple) -> list | None:
        """:meth:`_devices` of ``plan``, from the prefix sums ``sums`` and the ``outside`` nodes' (parameters before
        the first block and after the last, their saved activations)."""
        devices = [[0.0, 0.0, 0.0] for _ in range(plan.pp)]  # dense parameters, kept bytes, kept output gradients
        (params, kept, owed), at = sums, self._at
        for stage, chunk in zip(plan_chunk_stages(plan, len(plan.stages)), plan.stages):
            first, last = at[chunk[0]], at[chunk[-1]] + 1
            if last - first != len(chunk):
                return None
            device = devices[stage]
            device[0] += params[last] - params[first]
            device[1] += kept[last] - kept[first]
            device[2] += owed[last] - owed[first]
        pre, post, pre_saved, post_saved, post_owed = outside
        last = devices[plan_last_stage(plan)]
        devices[0][0] += pre
        devices[0][1] += pre_saved
        last[0], last[1], last[2] = last[0] + post, last[1] + post_saved, max(0.0, last[2] + post_owed)
        return devices

    def _per_block(self, plan: Plan) -> tuple:
        """(its memo key: the tp_plan by identity, floor context, recompute and tp overlap; prefix sums over the
        graph's blocks of their dense parameters, kept bytes and kept output gradients; (pre, post parameters)) of
        ``plan``'s blocks at floor_context, under its recompute and tp overlap."""
        stage_costs = self.search.stage_costs
        ctx = stage_costs.floor_context(plan)
        key = (id(plan.tp_plan), ctx.key, plan.recompute, plan.tp_comm_overlap)
        hit = self._blocks.get(key)
        if hit is None or hit[0] is not plan.tp_plan:  # the tp_plan held, so its id stays its own
            model = stage_costs.cost_model
            blocks = model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            pre, post = model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            parts = [
                (b.param_count - b.expert_param_count, kept_bytes(b, plan.recompute), b.wgrad_held_bytes)
                for b in map(blocks.__getitem__, self.search.graph.layers)
            ]
            sums = tuple(list(itertools.accumulate((p[j] for p in parts), initial=0.0)) for j in range(3))
            outside = (pre.param_count, post.param_count, pre.saved_bytes, post.saved_bytes)
            outside += (post.wgrad_held_bytes - post.loss_saved_bytes,)  # the loss's saved freed at B (replayed.py)
            hit = self._blocks[key] = (plan.tp_plan, (sums, outside))
        return (key, *hit[1])
