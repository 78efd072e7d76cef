"""The cost model: predicted step time, memory and throughput of a plan, without running it.

:class:`CostModel` prices blocks once per distinct choice (autoplan/cost/blocks.py) and then
assembles each plan with arithmetic, so the planner can price thousands of plans a second.
The step time of one global batch (one optimizer step) is the sum of ``Cost.TIME_FIELDS``; docs/cost-model.md
("Step time") is the one statement of each term with its source, and :meth:`CostModel._time`
computes each. The terms are objects with explicit inputs (docs/architecture.md, "The cost model's
layout"): ``dp_terms`` (cost/dp/sync.py, pricing the messages cost/dp/messages.py states),
``memory`` (cost/memory/plan.py), ``tied`` (cost/pp/tied.py), ``sp_sync`` (cost/tp/sp_sync.py) and
``experts`` (cost/moe/placement.py); the pipeline's sends are cost/pp/messages.py's. Under ``schedule_steps`` k > 1
(types/schedule_steps.py) the schedule's shape (bubble, fill and drain sends, the EP overlap's pairing, re-runs
and the memory) is priced on one schedule step of m / k micro-batches, the time terms k times.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost.blocks import LayerSummary
from autoplan.cost.compute.dtypes import dtype_policy
from autoplan.cost.compute.eager_attention import FusedAttentionModel
from autoplan.cost.compute.fp8 import fp8_recipe as recipe_of
from autoplan.cost.compute.fusion import fuses_elementwise
from autoplan.cost.compute.op_costs import NodeTimes
from autoplan.cost.compute.recompute import RecomputeFlops
from autoplan.cost.compute.roofline import memory_time_s, peak_dtype
from autoplan.cost.cp.block import check_context_parallel
from autoplan.cost.cp.weights import weight_sync_plan
from autoplan.cost.dp.accumulation import accumulate_s
from autoplan.cost.dp.compression import PowerSGDTraffic
from autoplan.cost.dp.local_sgd import price_outer_sync
from autoplan.cost.dp.sync import DataParallelTerms
from autoplan.cost.memory.activation_offload import link_bytes_per_s, offload_block
from autoplan.cost.memory.alone import fill_memory
from autoplan.cost.memory.offload import price_offload
from autoplan.cost.memory.per_device import StageMemory
from autoplan.cost.memory.plan import PlanMemory
from autoplan.cost.moe.a2a_overlap import step_ep_s
from autoplan.cost.moe.experts import ExpertPlacement, check_divides
from autoplan.cost.moe.placement import ExpertGroups, optimizer_params
from autoplan.cost.network.mesh import AxisGroup, mesh_groups, plan_mesh_groups
from autoplan.cost.pp import messages as pp_messages
from autoplan.cost.pp.reruns import chunk_forward_reruns, plan_forward_reruns
from autoplan.cost.pp.schedule import balanced_stages, stage_bubble_s
from autoplan.cost.pp.tied import TiedWeightSync
from autoplan.cost.stages import StageTotals, add_block, add_boundary
from autoplan.cost.summaries import BlockSummaries, part_context
from autoplan.cost.tp.default import default_tp_plan
from autoplan.cost.tp.plan_memo import TpPlanMemo
from autoplan.cost.tp.sp_sync import SequenceParallelSync
from autoplan.cost.tp.splits import TPContext
from autoplan.errors import PlanError
from autoplan.types.cost import Cost
from autoplan.types.expert_layout import experts_apart
from autoplan.types.graph import Graph
from autoplan.types.hsdp import shard_view
from autoplan.types.moe import RoutingModel
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.recompute import recomputed_blocks
from autoplan.types.schedule_steps import schedule_step_plan
from autoplan.types.schedules import plan_chunk_stages, plan_last_stage, v_shaped

ADAM_BYTES_PER_PARAM = 28  # read weight, gradient, 2 moments, write weight, 2 moments (fp32); 16-bit copy


class CostModel:
    """Prices plans for one graph on one profile; block summaries are cached across plans. Its terms
    are attributes: ``dp_terms``, ``memory``, ``tied``, ``sp_sync`` and ``experts``."""

    def __init__(self, graph: Graph, profile: Profile):
        self.graph, self.profile = graph, profile
        self._layer_set = set(graph.layers)
        self.node_times = NodeTimes(graph, profile)  # shared with the search's bounds and ILPs
        self.summaries = BlockSummaries(graph, profile, self.node_times)  # each distinct block priced once
        self._rep, self._structures = self.summaries.rep, self.summaries.structures
        inputs = {layer: (rep, self._structures[rep].inputs) for layer, rep in self._rep.items()}
        self._boundaries = pp_messages.BoundaryMemo(graph, profile.backend, inputs)  # block_inputs, memoised
        self.dp_terms = DataParallelTerms(profile, graph)  # the dp and ZeRO terms (cost/dp/sync.py)
        self._memo = TpPlanMemo()  # per-tp_plan values shared by candidate plans
        self._step_flops = graph.step_flops  # summed once: estimate() stays arithmetic
        self._recompute_flops = RecomputeFlops(
            graph, {layer: self._structures[self._rep[layer]].nodes for layer in graph.layers}
        )
        self._default_plans: dict[tuple[int, bool], dict[str, str]] = {}
        self.memory = PlanMemory(profile)
        self.tied = TiedWeightSync(graph, profile, {part: s.nodes for part, s in self.summaries.outside.items()})
        self.sp_sync = SequenceParallelSync(graph, profile)
        self.experts = ExpertGroups(graph, profile)
        self.fused_attention = FusedAttentionModel(graph, profile, build=CostModel)  # for runtimes with their own

    # ---- block summaries (cost/summaries.py) ----------------------------------------------
    def block_summary(self, layer: str | None, tp_plan: dict[str, str], ctx: TPContext, part: str = "") -> LayerSummary:
        """One micro-batch of block ``layer`` (or of the outside nodes, ``layer=None`` with part
        "pre"/"post") under ``tp_plan`` and ``ctx``, priced once per group of identical blocks
        (BlockSummaries.summary); the solver's partition reads the same summaries."""
        return self.summaries.summary(layer, tp_plan, ctx, part)

    part_context = staticmethod(part_context)

    def _tp_plan(self, plan: Plan) -> dict[str, str]:
        if plan.tp_plan or plan.tp == 1:
            return plan.tp_plan
        key = (plan.tp, plan.sequence_parallel)
        if key not in self._default_plans:
            self._default_plans[key] = default_tp_plan(self.graph, plan.tp, sequence_parallel=plan.sequence_parallel)
        return self._default_plans[key]

    # ---- the plan ------------------------------------------------------------------------
    def stage_layers(self, plan: Plan, stage: int) -> list[str]:
        """The blocks pipeline stage ``stage`` runs: those of its chunks (autoplan/types/layout.py)."""
        chunks = self._chunks(plan)
        return [layer for k, c in zip(plan_chunk_stages(plan, len(chunks)), chunks) if k == stage for layer in c]

    def _chunks(self, plan: Plan) -> list[list[str]]:
        if not plan.stages:
            return balanced_stages(self.graph.layers, plan.pp * plan.virtual_stages)
        listed = [layer for chunk in plan.stages for layer in chunk]
        unknown = [layer for layer in listed if layer not in self._layer_set]
        if unknown:
            raise PlanError(
                f"plan stages name block '{unknown[0]}', which the graph does not have; use the graph's layer names."
            )
        if len(listed) != len(self._layer_set):
            missing = next(layer for layer in self.graph.layers if layer not in set(listed))
            raise PlanError(f"plan stages leave out block '{missing}'; every block must be on exactly one stage.")
        return plan.stages

    def block_summaries(
        self, tp_plan: dict[str, str], ctx: TPContext, tp_comm_overlap: bool
    ) -> dict[str, LayerSummary]:
        """Every block's summary as the plan runs it, in the graph's order, memoised per tp_plan."""
        return self.summaries.blocks(tp_plan, ctx, tp_comm_overlap)

    def outside_summaries(
        self, tp_plan: dict[str, str], ctx: TPContext, tp_comm_overlap: bool
    ) -> tuple[LayerSummary, LayerSummary]:
        """The nodes before the first block and after the last, as the plan runs them."""
        return self.summaries.outside_summaries(tp_plan, ctx, tp_comm_overlap)

    def _stages(self, plan: Plan, tp_plan: dict[str, str], ctx: TPContext) -> list[StageTotals]:
        """Per-stage totals, memoised (read-only): shared by plans apart only in ZeRO or schedule (not V placement)."""
        chunks = (v_shaped(plan.schedule), *(tuple(chunk) for chunk in self._chunks(plan)))  # placement, chunks
        budget = (tuple(plan.recompute_blocks), plan.offload_activations)  # which blocks recompute, the rest offload?
        reruns = chunk_forward_reruns(plan) if plan.recompute != "none" else ()  # B and W split: two (reruns.py)
        key = ("stages", *ctx.key, plan.recompute, budget, plan.pp, chunks, plan.tp_comm_overlap, reruns)
        return self._memo.get(key, tp_plan, lambda: self._sum_stages(plan, tp_plan, ctx))

    def _sum_stages(self, plan: Plan, tp_plan: dict[str, str], ctx: TPContext) -> list[StageTotals]:
        stages = [StageTotals() for _ in range(plan.pp)]
        summaries = self.block_summaries(tp_plan, ctx, plan.tp_comm_overlap)
        pre, post = self.outside_summaries(tp_plan, ctx, plan.tp_comm_overlap)
        rerun = set(self.recomputed_layers(plan))  # the outside nodes run as their stage's blocks (cost/stages.py)
        add_block(stages[0], pre, recompute=self._outside_recompute(plan, rerun, 0), is_block=False)
        chunks = self._chunks(plan)
        placed = [stages[k] for k in plan_chunk_stages(plan, len(chunks))]
        for index, (stage, chunk) in enumerate(zip(placed, chunks)):
            for position, layer in enumerate(chunk):
                block = summaries[layer]
                if position == 0 and index > 0:  # chunk index's input, chunk index - 1's output (cost/stages.py)
                    add_boundary(stage, placed[index - 1], block, whole=plan.tp if plan.sequence_parallel else 1)
                recompute = plan.recompute if layer in rerun else "none"
                add_block(stage, block, recompute=recompute, chunk=index, reruns=plan_forward_reruns(plan, index))
                if plan.offload_activations and layer not in rerun:  # types/activation_offload.py
                    offload_block(stage, block, link_bytes_per_s=link_bytes_per_s(self.profile))
        last = plan_last_stage(plan)  # pp - 1, or stage 0 in a V (types/layout.py), whose first and last chunk
        stages[last].param_names -= set() if len(chunks) == 1 else set(pre.param_names)  # each hold a tied copy
        add_block(stages[last], post, recompute=self._outside_recompute(plan, rerun, last), is_block=False)
        return stages

    def _outside_recompute(self, plan: Plan, rerun: set[str], stage: int) -> str:
        """The plan's recompute where ``stage`` recomputes a block, else "none"."""
        return plan.recompute if any(layer in rerun for layer in self.stage_layers(plan, stage)) else "none"

    def recomputed_layers(self, plan: Plan) -> list[str]:
        """The blocks that run the plan's recompute: every one, or the first k of each chunk under a budget
        (types/recompute.py; PlanError when it asks a chunk for more blocks than it runs)."""
        chunks = self._chunks(plan)
        return recomputed_blocks(recompute=plan.recompute, recompute_blocks=plan.recompute_blocks, chunks=chunks)

    def layer_reruns(self, plan: Plan, stage: int) -> dict[str, float]:
        """{block: its forward re-runs per micro-batch} of the blocks of ``stage`` that run the plan's recompute
        (:meth:`recomputed_layers`), each at its chunk's count (cost/pp/reruns.py; the audit's collectives)."""
        rerun, chunks = set(self.recomputed_layers(plan)), self._chunks(plan)
        placed = enumerate(zip(plan_chunk_stages(plan, len(chunks)), chunks))
        return {
            layer: plan_forward_reruns(plan, c)
            for c, (k, chunk) in placed
            if k == stage
            for layer in chunk
            if layer in rerun
        }

    def for_runtime(self, runtime: str) -> CostModel:
        """The model of the graph as ``runtime`` runs it (FusedAttentionModel.for_runtime: eager attention
        fused, positional masks causal, the runtime's attention kernel); itself when it runs the graph as
        traced. Every price of a plan (``estimate``, ``priced_stages``, ops.csv, the audit's volumes, the
        search's summaries and bounds) reads this one model, so they price the same graph."""
        return self.fused_attention.for_runtime(runtime) or self

    def priced_stages(self, plan: Plan, *, copy: bool = True) -> tuple[list[StageTotals], dict[str, str], TPContext]:
        """The per-stage totals ``estimate`` prices (``copy=False``: the memoised ones, for a reader), the tp_plan
        it prices (the Megatron default when the plan has none) and the TP context: what the audit predicts from."""
        if (model := self.for_runtime(plan.runtime)) is not self:
            return model.priced_stages(plan, copy=copy)
        stages, tp_plan, ctx, _groups = self._priced(plan)
        return [replace(stage) for stage in stages] if copy else stages, tp_plan, ctx

    def tp_context(self, plan: Plan, *, fp8_recipe: str = "") -> TPContext:
        """The tensor-parallel context ``plan`` is priced in (its tp group on the profile's nodes), its
        FP8 linears running ``fp8_recipe`` when given, else the plan's (cost/compute/fp8.py)."""
        groups = mesh_groups(self.profile, dp=plan.dp, tp=plan.tp, pp=plan.pp, cp=plan.cp)
        return TPContext(
            profile=self.profile,
            tp=plan.tp,
            group=groups["tp"],
            sequence_parallel=plan.sequence_parallel,
            precision=plan.precision,
            batch_fraction=plan.micro_batch_size / self.graph.batch_size / plan.cp,  # a rank's 1/cp of the tokens
            experts=self.experts.for_plan(plan),
            cp=plan.cp,
            cp_variant=plan.cp_variant,
            cp_group=groups["cp"] if plan.cp > 1 else None,
            fp8=recipe_of(plan, recipe=fp8_recipe),
            fused=fuses_elementwise(plan),
            dtypes=dtype_policy(plan, backend=self.profile.backend),  # each activation's run dtype
        )

    def _priced(
        self, plan: Plan, *, fp8_recipe: str = ""
    ) -> tuple[list[StageTotals], dict[str, str], TPContext, dict[str, AxisGroup]]:
        self._check(plan)
        groups = plan_mesh_groups(self.profile, plan)
        tp_plan = self._tp_plan(plan)
        ctx = self.tp_context(plan, fp8_recipe=fp8_recipe)
        return self._stages(schedule_step_plan(plan), tp_plan, ctx), tp_plan, ctx, groups  # re-runs per step

    def estimate(self, plan: Plan, *, fp8_recipe: str = "") -> Cost:
        """Predict ``plan``'s step time, per-device memory and throughput (module docstring); with
        ``fp8_recipe``, as if its FP8 linears ran that recipe (report/fp8.py compares recipes)."""
        if (model := self.for_runtime(plan.runtime)) is not self:
            return model.estimate(plan, fp8_recipe=fp8_recipe)
        stages, _tp_plan, _ctx, groups = self._priced(plan, fp8_recipe=fp8_recipe)
        cost = Cost()
        self._time(cost, plan, stages, groups)
        fill_memory(self, cost, plan, stages)  # one schedule step's; the search asks it alone first (memory/alone.py)
        price_outer_sync(cost, self.profile, plan, stages, groups=groups)  # local SGD / DiLoCo, if any
        self._throughput(cost, plan)
        return cost

    def _check(self, plan: Plan) -> None:
        if plan.pp * plan.virtual_stages > max(1, len(self.graph.layers)):  # one chunk needs no blocks
            raise PlanError(
                f"plan needs {plan.pp * plan.virtual_stages} pipeline chunks "
                f"but the model has {len(self.graph.layers)} blocks; use fewer stages."
            )
        if plan.ep * plan.expert_tp > 1:
            check_divides(self.graph, plan.ep, expert_tp=plan.expert_tp)
        if plan.cp > 1:
            check_context_parallel(self.graph, plan)
        if self.profile.inter_node is None and plan.devices > self.profile.devices_per_node:
            raise PlanError(
                f"profile '{self.profile.name}' describes one node of {self.profile.devices_per_node} devices "
                "and has no inter_node link; plan for at most that many devices."
            )

    # ---- time ----------------------------------------------------------------------------
    def _time(self, cost: Cost, plan: Plan, stages: list[StageTotals], groups: dict[str, AxisGroup]) -> None:
        m, p = plan.num_microbatches, plan.pp
        k, step = plan.schedule_steps, schedule_step_plan(plan)  # k schedule steps of m / k (types/schedule_steps.py)
        chunks = self._chunks(plan)
        slowest = max(stages, key=lambda s: s.micro_batch_s)
        cost.compute_s = m * slowest.compute_s
        cost.recompute_s = m * slowest.recompute_s
        cost.tp_comm_s = m * slowest.tp_s + self.sp_sync.grad_sync_s(plan, self._tp_plan(plan), chunks, groups["tp"])
        cost.ep_comm_s = k * step_ep_s(step, slowest, rank=stages.index(slowest))  # cost/moe/a2a_overlap.py
        cost.cp_comm_s = m * slowest.cp_s
        cost.bubble_s = k * stage_bubble_s(step, slowest)  # each schedule step fills and drains
        inputs = self.chunk_inputs(plan) if p > 1 else []  # what each pipeline chunk receives (cost/pp/messages.py)
        sends_s = pp_messages.pipeline_sends_s(self.profile, step, inputs, group=groups["pp"], tp_group=groups["tp"])
        sends_s *= k  # (v m / k + p - 1) slots per schedule step
        cost.pp_comm_s = sends_s + self.tied.sync_s(plan, chunks, stages, groups["pp"])
        cost.grad_accum_s = (m - 1) * max(accumulate_s(self.profile, plan, s.trainable_params) for s in stages)
        weights = weight_sync_plan(plan)  # gradients sync over dp x cp (cost/cp/weights.py)
        edp = self.edp_group(plan) if experts_apart(plan) else groups["dp"]
        self.dp_terms.price(cost, weights, stages, group=groups["dp_shard"], edp=edp, replicate=groups["dp_replicate"])
        local_params = max(optimizer_params(shard_view(weights), s) for s in stages)
        cost.optimizer_s = memory_time_s(self.profile, local_params * ADAM_BYTES_PER_PARAM)
        price_offload(cost, self.profile, weights, stages, backward_s=m * slowest.bwd_s)  # a host step, if any
        cost.step_time_s = sum(getattr(cost, name) for name in Cost.TIME_FIELDS)

    def chunk_inputs(self, plan: Plan) -> pp_messages.ChunkInputs:
        """Per pipeline chunk, what it receives per micro-batch (cost/pp/messages.py)."""
        return self._boundaries.get([chunk[0] for chunk in self._chunks(plan)], plan)

    def block_inputs(self, layer: str, plan: Plan, *, in_precision: bool = False) -> pp_messages.Boundary:
        """What a chunk starting at block ``layer`` receives per micro-batch (pp_messages.block_inputs), in the
        run's dtypes or ``in_precision`` (a floor of every dtype policy: the search's bounds)."""
        return self._boundaries.get([layer], plan, in_precision=in_precision)[0]

    def powersgd_stage(self, plan: Plan, stage: StageTotals) -> PowerSGDTraffic:
        """A stage's PowerSGD traffic (DataParallelTerms.powersgd_stage)."""
        return self.dp_terms.powersgd_stage(plan, stage)

    # ---- the terms, as other code asks them of the model -----------------------------------------
    def stage_memory(self, plan: Plan, stages: list[StageTotals]) -> list[StageMemory]:
        """Per stage, its memory on one device (PlanMemory.stage_memory, with the plan's PowerSGD traffic),
        its weights shared by the dp x cp ranks (cost/cp/weights.py), in one schedule step (types/schedule_steps.py)."""
        weights = weight_sync_plan(schedule_step_plan(plan))
        return self.memory.stage_memory(shard_view(weights), stages, [self.powersgd_stage(weights, s) for s in stages])

    def tied_elements_by_stage(self, plan: Plan, stages: list[StageTotals]) -> dict[int, float]:
        """TiedWeightSync.elements_by_stage of the plan's chunks."""
        return self.tied.elements_by_stage(plan, self._chunks(plan), stages)

    def sp_partial_elements(self, plan: Plan, tp_plan: dict[str, str], layers: list[str | None]) -> list[float]:
        """SequenceParallelSync.partial_elements."""
        return self.sp_sync.partial_elements(plan, tp_plan, layers)

    def expert_placement(self, plan: Plan) -> ExpertPlacement | None:
        """ExpertGroups.for_plan."""
        return self.experts.for_plan(plan)

    def placement(self, *, routing: RoutingModel | None, **degrees: int) -> ExpertPlacement | None:
        """ExpertGroups.placement for the degrees tp, dp, ep, pp and expert_tp (the search's bounds ask before
        any plan is built)."""
        return self.experts.placement(routing=routing, **degrees)

    def edp_group(self, plan: Plan) -> AxisGroup:
        """ExpertGroups.edp_group."""
        return self.experts.edp_group(plan)

    # ---- throughput ----------------------------------------------------------------------
    def _throughput(self, cost: Cost, plan: Plan) -> None:
        graph, step = self.graph, cost.step_time_s
        samples = plan.global_batch_size
        model_flops = self._step_flops * samples / graph.batch_size
        peak = self.profile.device.peak_flops[peak_dtype(self.profile, plan.precision)]
        cost.samples_per_s = samples / step if step > 0 else 0.0
        cost.tokens_per_s = cost.samples_per_s * graph.seq_len if graph.seq_len else None
        cost.mfu = model_flops / (step * plan.devices * peak) if step > 0 else 0.0
        if self.profile.price_per_device_hour is not None:
            cost.cost_per_step_usd = self.profile.price_per_device_hour * plan.devices * step / 3600.0
        cost.extra.update(
            model_flops=model_flops,
            hardware_flops=model_flops + self._recompute_flops.per_sample(plan, self._chunks) * samples,
            peak_flops_per_device=peak,
        )


def estimate(graph: Graph, profile: Profile, plan: Plan) -> Cost:
    """Predict one plan (a convenience around :class:`CostModel`)."""
    return CostModel(graph, profile).estimate(plan)
