"""Lower bounds on what CostModel charges a plan, so the search can skip what cannot win.

Each term is one of CostModel's step-time terms at a value it can never go below, so a bound never
exceeds the priced step time (a test checks this for every priced candidate):

- ``compute_min_s``: forward + backward of one micro-batch with every op divided tp ways (and its
  tokens cp ways, plus each attention's K,V traffic at its floor, cost/cp/floor.py) and no other
  communication (op time falls as the shard grows: F/(peak*eff(F)) = (F + F_half)/(peak*a)); the
  routed experts' GEMMs as CostModel prices them at tp = 1, and at tp > 1 divided only where a legal
  split shards them; an fp8 linear also priced whole, the smaller kept;
- ``zero_bubble_share``: a floor on a zero-bubble schedule's (T0 - 2W) / T0 without re-runs (its bubble's share), the
  routed experts' grouped GEMMs at their largest W / T under any placement;
- ``pp_comm_s``: (v m + p - 1)(t_p2p(forward) + t_p2p(backward)) with the smallest block inputs;
- ``step_extras_s``: Adam on the largest stage's parameters (28 bytes each), ZeRO-1/2's weight
  all-gather, and the gradient sync exposed on stage 0 whatever the overlap (its first block's),
  priced from cost/dp/messages.py at each message's floor bytes per parameter (cost/dp/floors.py).

``states_floor_bytes`` bounds memory: the model states of the fewest parameters the fullest stage can hold,
(blocks + max(pre, post)) / pp (ZeRO over HSDP's shards), the routed experts' over pp (memory/experts_floor.py):
peak >= W + O + G; ``memory_floor_bytes`` adds the activations the schedule keeps in flight (memory/in_flight_floor.py);
``sends`` the boundary tensors torch's runtime holds to the step's end (cost/memory/sent_floor.py).
docs/ilp.md, "Bounds" has the derivation of each term.
"""

from __future__ import annotations

from typing import Protocol

from autoplan.cost.compute.fp8 import EXPERTS_FP8_FLOOR
from autoplan.cost.compute.op_costs import node_time_s
from autoplan.cost.compute.roofline import input_bytes_of, memory_time_s
from autoplan.cost.cp.floor import CpFloor, cp_floor, kv_exposed_floor_s, kv_floor_inputs
from autoplan.cost.dp.accumulation import accumulation_bytes_per_param
from autoplan.cost.dp.floors import SyncFloors, weights_messages
from autoplan.cost.dp.sparse_embedding import sparse_tables
from autoplan.cost.memory.experts_floor import ExpertsFloor
from autoplan.cost.memory.in_flight_floor import activations_floor, held_sent, schedule_key, schedule_weights
from autoplan.cost.memory.per_device import model_states
from autoplan.cost.memory.sent_floor import SendsFloor
from autoplan.cost.model import ADAM_BYTES_PER_PARAM, CostModel
from autoplan.cost.moe.experts import ExpertPlacement, a2a_times_s, grouped_gemm_s, is_expert_gemm, layers_in
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import plan_mesh_groups
from autoplan.cost.pp.split_backward import weight_grad_flops, weight_grad_s
from autoplan.cost.pp.zero_bubble import bubble_share
from autoplan.cost.tp.block import STREAM_KINDS, BlockAnalysis, analyse_block
from autoplan.cost.tp.shards import pure_layouts_possible
from autoplan.cost.tp.splits import legal_splits
from autoplan.types.graph import Graph, OpNode
from autoplan.types.hsdp import state_shards
from autoplan.types.moe import MoELayer
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.schedule_steps import schedule_step_plan


class StageFacts(Protocol):
    """What the bounds read of a plan's stages before any is priced (solve/stage_costs.py's StageCosts):
    parameter counts and boundary sizes, each a floor over every partition."""

    cost_model: CostModel

    def param_parts(self, plan: Plan) -> tuple[float, float, float]: ...

    def min_boundary_bytes(self, plan: Plan) -> tuple[float, float]: ...

    def sync_params(self, plan: Plan) -> tuple[float, float]: ...

    def single_stage_blocks(self, plan: Plan) -> tuple: ...

    def kept_bytes_total(self, plan: Plan) -> tuple[float, float]: ...


class Bounds:
    """The search's lower bounds (module docstring), memoised per tp, precision and micro-batch."""

    def __init__(self, graph: Graph, profile: Profile, stage_costs: StageFacts):
        self.graph, self.profile, self.stage_costs = graph, profile, stage_costs
        self._c_min: dict[tuple, float] = {}
        self._experts_min: dict[tuple, float] = {}
        self._cp_floors: dict[tuple, CpFloor] = {}
        self._groups: dict[tuple, dict] = {}
        self._schedule_weights: dict[tuple, tuple] = {}  # (schedule_weights, held_sent) by schedule_key
        self._frozen = float(graph.param_count - graph.trainable_param_count)
        self.experts = ExpertsFloor(stage_costs)  # the routed experts' states summed over the stages
        self.sends = SendsFloor(stage_costs, self.trained_floor, self.experts.states_bytes)  # torch's runtime's sends
        sparse = float(sum(t.rows * t.dim for t in sparse_tables(graph)))  # out of the dense buckets
        self.sync = SyncFloors(
            profile, stage_costs, mesh=self._mesh, trained_floor=lambda p: max(0.0, self.trained_floor(p) - sparse)
        )
        reps = [(None, 1)] + [(group.layers[0], len(group.layers)) for group in graph.groups]
        self._nodes = {rep: graph.layer_nodes(rep) for rep, _ in reps}
        self._moe = {rep: layers_in(graph, tuple(self._nodes[rep])) for rep, _ in reps}  # grouped MoE layers
        self._gemms = {rep: _expert_gemms(self._nodes[rep], self._moe[rep]) for rep, _ in reps}  # node -> its layer
        self._reps = [(rep, count) for rep, count in reps if self._gemms[rep]]
        self._attentions = [n for n in graph.nodes if n.op == "attention"]  # the K,V floor's nodes, in order

    def compute_min_s(
        self,
        *,
        tp: int,
        precision: str,
        mbs: int,
        experts: ExpertPlacement | None = None,
        cp: int = 1,
        cp_variant: str = "allgather",
        dp: int = 1,
        pp: int = 1,
        fused: bool = False,
        a2a_share: float = 1.0,
    ) -> float:
        """C_min (one block per group of identical blocks, times the group size); ``fused``: some plan
        of the group runs element-wise ops as fused regions (cost/compute/fusion.py), whose price is
        at most the eager one, so the floor prices them fused; ``experts`` is
        the plan's expert placement (CostModel.placement), which prices the routed experts at tp = 1;
        under context parallelism (``cp`` > 1, ``cp_variant``; ``dp`` and ``pp`` place its group) each
        rank computes 1/cp of the tokens, plus each attention's K,V floor (cost/cp/floor.py); ``a2a_share``: the
        all-to-all's least share left exposed (below 1 where the group may overlap it: cost/moe/a2a_overlap.py)."""
        if cp > 1:
            mesh = (dp, tp, pp, cp, cp_variant)
            if mesh not in self._cp_floors:
                self._cp_floors[mesh] = cp_floor(self.profile, dp=dp, tp=tp, pp=pp, cp=cp, variant=cp_variant)
            floor = self._cp_floors[mesh]
            return self._cp_compute_min_s(tp=tp, precision=precision, mbs=mbs, cp=floor, fused=fused)
        key = (tp, precision, mbs, fused)
        if key not in self._c_min:
            f = mbs / self.graph.batch_size

            def nodes_s(layer: str | None) -> float:
                skip = self._gemms[layer]  # priced by _experts_min_s
                nodes = [n for n in self._nodes[layer] if n.name not in skip]
                return sum(self._op_min_s(n, shard=tp, precision=precision, f=f, fused=fused) for n in nodes)

            total = nodes_s(None)
            total += sum(len(group.layers) * nodes_s(group.layers[0]) for group in self.graph.groups)
            self._c_min[key] = total
        if not self._reps:
            return self._c_min[key]
        experts_s = self._experts_min_s(tp=tp, precision=precision, mbs=mbs, experts=experts, a2a_share=a2a_share)
        return self._c_min[key] + experts_s

    def _cp_compute_min_s(self, *, tp: int, precision: str, mbs: int, cp: CpFloor, fused: bool = False) -> float:
        """C_min of a plan with cp > 1: every op at 1/cp of the micro-batch's tokens (CostModel prices
        balanced attention so), plus each attention's exposed K,V floor (cost/cp/floor.py)."""
        key, ops_key = (tp, precision, mbs, cp, fused), ("cp ops", tp, precision, mbs, cp.cp, fused)
        f = mbs / self.graph.batch_size / cp.cp
        if ops_key not in self._c_min:  # the ops read cp's degree alone, not its group: shared by every mesh
            kw = dict(precision=precision, f=f, fused=fused)
            total = sum(self._op_min_s(n, shard=tp, **kw) for n in self._nodes[None])
            total += sum(
                len(group.layers) * sum(self._op_min_s(n, shard=tp, **kw) for n in self._nodes[group.layers[0]])
                for group in self.graph.groups
            )
            self._c_min[ops_key] = total
        if key not in self._c_min:
            self._c_min[key] = self._c_min[ops_key] + self._kv_floor_s(tp=tp, precision=precision, f=f, cp=cp)
        return self._c_min[key]

    def _kv_floor_s(self, *, tp: int, precision: str, f: float, cp: CpFloor) -> float:
        """Every attention's K,V floor (cost/cp/floor.py), memoised on what it reads: not ``fused`` (no message is);
        the messages of attentions with equal inputs (kv_floor_inputs: identical blocks') priced once, summed in the
        graph's order."""
        key = ("cp kv", tp, precision, f, cp)
        if key not in self._c_min:
            times, floors, total = self.stage_costs.cost_model.node_times, {}, 0.0
            for n in self._attentions:
                inputs = kv_floor_inputs(n, self.profile, floor=cp, tp=tp, precision=precision, f=f, times=times)
                if inputs not in floors:
                    floors[inputs] = kv_exposed_floor_s(inputs, profile=self.profile, floor=cp)
                total += floors[inputs]
            self._c_min[key] = total
        return self._c_min[key]

    def zero_bubble_share(self, *, tp: int, precision: str, mbs: int, cp: int = 1) -> float:
        """A floor on (T - 2W) / T of any stage of any plan at these degrees (cost/pp/zero_bubble.py): the least
        over the nodes with weight gradients, each priced as the block summaries price it (at shard 1 and tp,
        whichever split it takes, and the routed experts' grouped GEMMs at any placement (_grouped_wgrad_parts);
        every other part of a stage has no W. 0 where the floor is not known: FP8 (its recipe is the plan's).
        Without re-runs: interleaved_zb's replayed bubble is at least (p - 1)/v (T0 - 2W), T0 the slowest stage's
        time without them (cost/pp/looped_replay.py); docs/ilp.md, bound (1), says when C_min / pp stays below T0."""
        key = ("zb", tp, precision, mbs, cp)
        if key not in self._c_min:
            parts = self._wgrad_parts(tp=tp, precision=precision, f=mbs / self.graph.batch_size / cp)
            parts = [(t, w, 0.0) for t, w in parts + self._grouped_wgrad_parts()]  # no re-runs: see the docstring
            self._c_min[key] = bubble_share(parts) if precision != "fp8" else 0.0
        return self._c_min[key]

    def _grouped_wgrad_parts(self) -> list[tuple[float, float]]:
        """(T, W) of each routed expert GEMM run grouped, scaled to T = 1, at its largest W / T over every
        placement, micro-batch and context split. cost/moe/experts.py grouped_gemm_s prices the forward
        F = h(s, o_f) and the backward B = h(2 s, o_b), s the GEMM's seconds, o_f, o_b the launch overheads,
        h = max on a GPU and + on the host; W = r B with r = its weight-gradient share of the backward FLOPs
        (cost/pp/split_backward.py). B / (F + B) rises with B / F, which lies between 2 (s large) and
        o_b / o_f (s small) for every s, so W / T <= r max(2/3, o_b / (o_f + o_b))."""
        overhead = self.profile.device.op_overhead
        launches = overhead.forward_s + overhead.backward_s if overhead else 0.0
        b_share = max(2.0 / 3.0, overhead.backward_s / launches if launches else 0.0)
        gemms = (self.graph.node(name) for gemms in self._gemms.values() for name in gemms)
        return [(1.0, b_share * weight_grad_flops(self.graph, n) / n.bwd_flops) for n in gemms if n.bwd_flops]

    def _wgrad_parts(self, *, tp: int, precision: str, f: float) -> list[tuple[float, float]]:
        """(forward + backward, W) seconds of every node with weight gradients, at shard 1 and tp."""
        times, (preds, _) = self.stage_costs.cost_model.node_times, self.graph.adjacency()
        parts = [(1.0, 0.0)]  # a stage of nodes without W: all of it idles in the bubble
        for node in (n for nodes in self._nodes.values() for n in nodes if weight_grad_flops(self.graph, n)):
            read = input_bytes_of([self.graph.node(p) for p in preds[node.name]], precision=precision)
            for way in {1, tp}:
                t_f, t_b = times(node, self.profile, precision=precision, batch_fraction=f, shard=way, reads=read)
                parts.append((t_f + t_b, weight_grad_s(self.graph, node, bwd_s=t_b)))
        return parts

    def _op_min_s(self, node: OpNode, *, shard: int, precision: str, f: float, fused: bool = False) -> float:
        """node_time_s at ``shard``; under fp8 a linear's also at shard 1, the smaller of the two
        (module docstring: whether it runs in FP8 depends on its shard)."""

        def at(way: int) -> float:
            return node_time_s(
                self.graph,
                node,
                self.profile,
                precision=precision,
                batch_fraction=f,
                shard=way,
                times=self.stage_costs.cost_model.node_times,
                fused=fused,
            )

        fastest = at(shard)
        return min(fastest, at(1)) if precision == "fp8" and node.op == "linear" and shard > 1 else fastest

    def _experts_min_s(
        self, *, tp: int, precision: str, mbs: int, experts: ExpertPlacement | None, a2a_share: float = 1.0
    ) -> float:
        """The routed experts' GEMMs and all-to-alls in C_min (module docstring)."""
        place = experts  # None at tp > 1 without the experts' own layout (cost/moe/placement.py)
        key = (tp, precision, mbs, place, a2a_share)
        if key not in self._experts_min:
            f = mbs / self.graph.batch_size
            self._experts_min[key] = sum(
                count
                * (
                    self._grouped_s(rep, precision=precision, f=f, place=place, a2a_share=a2a_share)
                    if place
                    else self._traced_s(rep, tp=tp, precision=precision, f=f)
                )
                for rep, count in self._reps
            )
        return self._experts_min[key]

    def _grouped_s(
        self, rep: str | None, *, precision: str, f: float, place: ExpertPlacement, a2a_share: float = 1.0
    ) -> float:
        """Block ``rep``'s expert GEMMs as grouped GEMMs and its all-to-alls (``a2a_share`` of them), as CostModel
        prices them at tp = 1."""
        gemms = sum(
            sum(
                grouped_gemm_s(
                    self.graph.node(name),
                    moe,
                    self.profile,
                    precision=precision,
                    batch_fraction=f,
                    place=place,
                    recipe=EXPERTS_FP8_FLOOR,  # under fp8 any runtime's experts run no faster than this
                    casts=False,
                )
            )
            for name, moe in self._gemms[rep].items()
        )
        a2a = sum(
            sum(a2a_times_s(moe, self.profile, precision=precision, batch_fraction=f, place=place))
            for moe in self._moe[rep]
        )
        return gemms + a2a_share * a2a

    def _traced_s(self, rep: str | None, *, tp: int, precision: str, f: float) -> float:
        """Block ``rep``'s expert GEMMs as the ops they trace to, each at the largest shard a split gives it."""
        block = analyse_block(self.graph, rep)
        legal = {v: legal_splits(self.graph.node(v), tp) for v in block.params}
        return sum(
            self._op_min_s(node, shard=_most_shards(block, legal, node, tp), precision=precision, f=f)
            for node in map(self.graph.node, self._gemms[rep])
        )

    def states_floor_bytes(self, plan: Plan) -> float:
        """The memory floor of the module docstring, bytes per device."""
        floor = self.stage_params_floor(plan)
        states = model_states(
            params=floor,
            trainable=self.trained_floor(floor),
            precision=plan.precision,
            zero_stage=plan.zero_stage,
            dp=state_shards(plan),  # dp x cp ranks share the weights (cost/cp/weights.py), HSDP's S x cp shard them
            pp=plan.pp,
            offload=plan.offload,
        )
        return states.total_bytes + self.experts.states_bytes(plan) / plan.pp

    def memory_floor_bytes(self, plan: Plan, *, offload: bool = False) -> float:
        """states_floor_bytes, or where larger the floor with the activations (cost/memory/in_flight_floor.py), with
        the receive slots every device holds (sent_floor.py slots_bytes); ``offload``: the search may price the plan
        with its activations on the host, so neither is counted. Of one schedule step (types/schedule_steps.py)."""
        floor = self.states_floor_bytes(plan := schedule_step_plan(plan))
        if (key := schedule_key(plan)) not in self._schedule_weights:  # read by every plan of one schedule
            self._schedule_weights[key] = schedule_weights(plan), held_sent(plan)
        weights, held = self._schedule_weights[key]
        if offload or (weights is None and plan.pp > 1):  # one stage of one micro-batch: activations_floor's M1
            return floor
        _, post, blocks = self.stage_costs.param_parts(plan)
        activations = activations_floor(
            plan, self.stage_costs.kept_bytes_total(plan), params=(blocks, self.trained_floor(blocks)),
            post=(post, self.trained_floor(post)), weights=weights, held=held, boundary=self.sends.boundary_bytes(plan),
            experts_bytes=self.experts.states_bytes(plan), states=floor,
        )  # fmt: skip
        return activations + self.sends.slots_bytes(plan)  # the slots: in M2 beside every term

    def pp_comm_s(self, plan: Plan) -> float:
        if plan.pp == 1:
            return 0.0
        scatter = plan.tp > 1 and not plan.sequence_parallel
        group = self._mesh(plan)["pp"]
        t_p2p = sum(
            collective_time_s(self.profile, "send_recv", size / plan.tp if scatter else size, group=group)
            for size in self.stage_costs.min_boundary_bytes(plan)
            if size
        )
        return (plan.virtual_stages * plan.num_microbatches + plan.pp - 1) * t_p2p

    def step_extras_s(self, plan: Plan, *, stage_params: float, params_floor: float | None = None) -> float:
        """Adam and ZeRO-1/2's gather on the fullest stage's ``stage_params``, the sync no overlap hides
        and the gradient accumulation; ``params_floor``: stage_params_floor(plan) when the caller has it."""
        messages = weights_messages(plan)  # read by both the gather and the sync
        return (
            self.optimizer_s(plan, stage_params=stage_params)
            + self.sync.zero_gather_s(plan, stage_params, messages)
            + self.sync.sync_s(plan, messages)
            + self.accumulate_s(plan, params_floor=params_floor)
        )

    def accumulate_s(self, plan: Plan, *, params_floor: float | None = None) -> float:
        """CostModel's gradient accumulation, (m - 1) micro-batches reading two gradients and writing one
        in the runtime's buffer, none where it is fused (CostModel._accumulate_s, cost/dp/accumulation.py),
        on the fewest parameters the fullest stage can hold: (blocks + max(pre, post)) / pp, as
        states_floor_bytes."""
        bytes_per_param = accumulation_bytes_per_param(plan)
        if plan.num_microbatches == 1 or plan.cp == 1 or not bytes_per_param:
            return 0.0
        params = self.trained_floor(self.stage_params_floor(plan) if params_floor is None else params_floor)
        return (plan.num_microbatches - 1) * memory_time_s(self.profile, bytes_per_param * params)

    def stage_params_floor(self, plan: Plan) -> float:
        """The fewest parameters per device the fullest stage can hold under any partition: (blocks +
        max(pre, post)) / pp (module docstring; with one stage the smaller part may be the tied copy)."""
        pre, post, blocks = self.stage_costs.param_parts(plan)
        return (blocks + max(pre, post)) / plan.pp

    def trained_floor(self, params: float) -> float:
        """The fewest of ``params`` parameters on a device that can be trainable: all but the graph's
        frozen ones, which a device holds at most once (docs/cost-model.md, "Frozen parameters")."""
        return max(0.0, params - self._frozen)

    def optimizer_s(self, plan: Plan, *, stage_params: float) -> float:
        """The device's Adam step over the trained parameters, or an offloaded plan's CPU step alone
        (cost/memory/offload.py, no copies)."""
        trained = self.trained_floor(stage_params)
        if plan.offload != "none":
            return trained / (plan.dp * plan.cp) / self.profile.host.adam_params_per_s  # checked by the plan
        return self.adam_s(trained / (state_shards(plan) if plan.zero_stage >= 1 else 1))

    def adam_s(self, local_params: float) -> float:
        """CostModel's memory-bound Adam step over ``local_params`` parameters, or the host's CPU Adam step
        where that is faster and the profile can offload (a group's plans may step on either)."""
        device_s = memory_time_s(self.profile, local_params * ADAM_BYTES_PER_PARAM)
        host = self.profile.host
        return device_s if host is None else min(device_s, local_params / host.adam_params_per_s)

    def _mesh(self, plan: Plan) -> dict:
        """mesh_groups of ``plan``'s degrees, memoised: the search asks once per candidate and message."""
        key = (plan.dp, plan.tp, plan.pp, plan.cp, plan.dp_replicate)
        if key not in self._groups:
            self._groups[key] = plan_mesh_groups(self.profile, plan)
        return self._groups[key]


def _expert_gemms(nodes: list[OpNode], layers: list[MoELayer]) -> dict[str, MoELayer]:
    """The routed experts' GEMMs among a block's ``nodes``, each with its MoE layer of ``layers``:
    the nodes CostModel prices as grouped GEMMs at tp = 1 (cost/moe/experts.py:block_experts)."""
    return {n.name: moe for moe in layers for n in nodes if is_expert_gemm(n, moe)}


def _most_shards(block: BlockAnalysis, legal: dict[str, tuple[str, ...]], node: OpNode, tp: int) -> int:
    """The largest compute shard any legal splits give ``node`` at ``tp`` (cost/tp/shards.py:shards):
    tp for a parameterised node with a split other than replicate, a pure node that can run on S
    or Q, or a node on the residual stream of a kind sequence parallelism shards; else 1."""
    if node.name in legal:
        return tp if len(legal[node.name]) > 1 else 1
    if node.name in block.origins:
        layouts = pure_layouts_possible(block, block.origins[node.name], legal, sequence_parallel=True)
        return tp if len(layouts) > 1 else 1
    return tp if node.op in STREAM_KINDS or node.name in block.token_wise else 1
