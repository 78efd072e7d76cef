"""Per-block numbers for the pipeline partition, from the cost model's own block summaries.

The partition (solve/pipeline.py) needs, per block and micro-batch, its time and its bytes;
these come from :func:`autoplan.cost.blocks.summarise`, the function CostModel prices blocks
with, so the partition balances exactly what the cost model will charge:

    time_i   = fwd + bwd + tp_fwd + tp_bwd  (+ r x (fwd + tp_fwd) under full recomputation,
                                             + r x (the re-run nodes' fwd + tp_fwd) under selective)
    static_i = parameters_i * bytes per parameter of weights, grads and Adam state after ZeRO
               (autoplan/cost/memory/per_device.py, Rajbhandari et al. SC'20)
    act_i    = saved bytes (none), block input + matmul outputs (selective), block input (full)

with r a recomputed block's forward re-runs (cost/pp/reruns.py: two where B and W split its backward), the
mean over the plan's chunks here (:meth:`StageCosts.partition_reruns`), each chunk's own in
:meth:`StageCosts.stage_totals`. Nodes outside every block add to stage 0 (those before the first block)
and to the last stage (the rest), as autoplan/cost/stages.py assigns them. A cut before block i costs one send/recv
of block i's input and one of its gradient (``cut_s``): identical blocks all cost the same, while
unlike blocks (a model's top-level modules, autoplan/trace/layers.py) cut at tensors of different
sizes, so the partition prefers the small ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter

from autoplan.cost import (
    CostModel,
    KeptBytes,
    LayerSummary,
    TPContext,
    TpPlanMemo,
    block_time_s,
    bubble_floor,
    bubble_share,
    chunk_forward_reruns,
    cut_s,
    in_flight_chunks,
    kept_bytes,
    kept_of,
    per_distinct,
    plan_forward_reruns,
    rerun_s,
    stage_capacity_bytes,
    state_bytes_per_param,
    v_forward_share,
)
from autoplan.solve.pipeline import PartitionProblem
from autoplan.types.expert_layout import expert_dp
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.schedules import plan_chunk_stages, plan_last_stage, v_shaped

#: the plan fields CostModel.tp_context reads: ep, expert_tp and routing the experts' placement (cost/moe/placement.py
#: for_plan); zero_stage with dp, cp, precision and runtime the activations' dtypes (cost/compute/dtypes.py)
_context_key = attrgetter(
    *("dp", "tp", "pp", "cp", "cp_variant", "sequence_parallel", "precision", "micro_batch_size", "ep", "expert_tp"),
    *("routing", "fp8_recipe", "runtime", "compile", "tp_comm_overlap", "zero_stage"),
)  # one C call builds the key tuple: the search asks ~190,000 times on DeepSeek-V3


class StageCosts:
    """The partition's view of a plan: CostModel's own block summaries (``CostModel.block_summary``),
    arranged per block and stage and memoised per tp_plan; a block's numbers are read once per distinct summary
    (cost/blocks.py ``per_distinct``: a group's identical blocks share one)."""

    def __init__(self, graph: Graph, profile: Profile, cost_model: CostModel | None = None):
        self.graph, self.profile = graph, profile
        self.cost_model = cost_model or CostModel(graph, profile)
        self._memo = TpPlanMemo()
        self._contexts: dict[tuple, tuple[TPContext, TPContext]] = {}
        self._in_flight: dict[tuple, tuple[float, ...]] = {}  # in_flight_chunks of each stage, by what it reads

    def summary(self, layer: str | None, part: str, tp_plan: dict[str, str], ctx: TPContext) -> LayerSummary:
        return self.cost_model.block_summary(layer, tp_plan, ctx, part)

    def context(self, plan: Plan) -> TPContext:
        """CostModel.tp_context (:meth:`_contexts_of`)."""
        return self._contexts_of(plan)[0]

    def _contexts_of(self, plan: Plan) -> tuple[TPContext, TPContext]:
        """(CostModel.tp_context, floor_context), memoised on the plan fields it reads (its mesh, sequence
        split, precision, micro-batch, expert placement, FP8 recipe, the weights' cast, and whether element-wise
        ops run fused: compiled, async TP or the runtime's kernels): the search's bounds ask several times per
        candidate."""
        hit = self._contexts.get(key := _context_key(plan))
        if hit is None:
            ctx = self.cost_model.tp_context(plan)
            hit = self._contexts[key] = (ctx, replace(ctx, dtypes=None))  # with floor_context's
        return hit

    def problem(self, plan: Plan, *, memory_limit: bool = True) -> PartitionProblem:
        """The partition problem of ``plan`` (its stages ignored; ``pp * virtual_stages`` chunks),
        per the module docstring."""
        static = _StaticBytes(plan)
        blocks = self._problem_blocks(plan, static)
        pre, post = blocks.pre, blocks.post
        last = plan_last_stage(plan)  # the loss's stage: pp - 1, or 0 in a V (types/layout.py)
        extra_time = [0.0] * plan.pp
        extra_time[0] += pre.fwd_s + pre.bwd_s
        extra_time[last] += post.fwd_s + post.bwd_s + post.tp_fwd_s + post.tp_bwd_s
        extra_bytes = [blocks.peak_block] * plan.pp  # StageTotals.transient_bytes
        extra_bytes[last] = max(blocks.peak_block, post.loss_grad_bytes)
        in_flight = self.in_flight(plan)
        extra_bytes[0] += static.dense(pre) + pre.saved_bytes * in_flight[0]
        extra_bytes[last] += static.dense(post) + post.saved_bytes * in_flight[last]
        cut_of = {size: cut_s(self.profile, plan, *size) for size in dict.fromkeys(blocks.inputs)}  # each size once
        cuts_s = [0.0, *(cut_of[size] for size in blocks.inputs), 0.0] if blocks.times else [0.0]  # no block: 1 cut
        capacity = (
            stage_capacity_bytes(
                self.profile,
                plan,
                boundary_bytes=blocks.boundary[0],
                grad_bytes=blocks.boundary[1],
                block_params=blocks.most_params,
            )
            if memory_limit
            else float("inf")
        )
        return PartitionProblem(
            layer_time_s=list(blocks.times),
            layer_static_bytes=list(blocks.static),
            layer_activation_bytes=list(blocks.acts),
            pp=plan.pp,
            extra_time_s=extra_time,
            extra_bytes=extra_bytes,
            in_flight=in_flight,
            p2p_s=max(cuts_s),
            capacity_bytes=capacity,
            virtual_stages=plan.virtual_stages,
            cut_s=cuts_s,
            v_shape=v_shaped(plan.schedule),
        )

    def in_flight(self, plan: Plan) -> list[float]:
        """cost/pp/schedule.py in_flight_chunks of each of ``plan``'s stages, memoised on all it reads: the schedule,
        pp, micro-batches, virtual stages and the all-to-all overlap's extra forward (a V's replay walks its ranks:
        ~4,000 problems on GPT-1T, ~300 distinct; tests/unit/solve/test_stage_costs_distinct.py)."""
        key = (plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages, plan.moe_a2a_overlap)
        if (hit := self._in_flight.get(key)) is None:
            hit = self._in_flight[key] = tuple(in_flight_chunks(plan, k) for k in range(plan.pp))
        return list(hit)

    def _problem_blocks(self, plan: Plan, static: _StaticBytes) -> _ProblemBlocks:
        """:meth:`problem`'s per-block numbers, memoised on what they read: the blocks' summaries (their context and
        overlap), the recompute, and the bytes per parameter (``static``): the search asks the problem of many
        plans apart only in their pipeline's memory (ZeRO, schedule, micro-batches)."""

        reruns = self.partition_reruns(plan)

        def make() -> _ProblemBlocks:
            ctx = self.context(plan)
            blocks = list(self.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap).values())
            pre, post = self.cost_model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            return _ProblemBlocks(
                times=tuple(per_distinct(blocks, lambda b: block_time_s(b, plan.recompute, reruns))),
                static=tuple(per_distinct(blocks, lambda b: static.dense(b, experts_apart=True) + static.experts(b))),
                acts=tuple(per_distinct(blocks, lambda b: kept_bytes(b, plan.recompute))),
                peak_block=max(b.saved_bytes for b in blocks) if plan.recompute == "full" else 0.0,
                boundary=(  # the first block's is never sent
                    max((b.input_bytes for b in blocks[1:]), default=0.0),
                    max((b.input_grad_bytes for b in blocks[1:]), default=0.0),
                ),
                inputs=tuple((b.input_bytes, b.input_grad_bytes) for b in blocks[1:]),  # identical blocks, tensors
                most_params=max((b.param_count for b in blocks), default=0),
                pre=pre,
                post=post,
            )

        key = ("problem", *self.context(plan).key, plan.recompute, plan.tp_comm_overlap, *static.rates, reruns)
        return self._memo.get(key, plan.tp_plan, make)

    @staticmethod
    def partition_reruns(plan: Plan) -> float:
        """The forward re-runs the partition charges a recomputed block: a block's chunk is the partition's
        choice, so the mean of cost/pp/reruns.py's over ``plan``'s chunks (1 where no backward splits)."""
        counts = chunk_forward_reruns(plan) if plan.recompute != "none" else (1.0,)
        return sum(counts) / len(counts)

    def stage_totals(self, plan: Plan, stages: list[list[str]]) -> tuple[list[float], list[float]]:
        """Per pipeline stage: one micro-batch's fwd + bwd + recompute + TP time (what CostModel
        calls ``micro_batch_s``) and the dense parameters it holds (the routed experts' left out: the
        bounds that read them must stay below what their other groups cost); chunks placed by types/layout.py."""
        ctx = self.context(plan)
        times_of, params_of, pre, post = self._block_totals(plan, ctx)
        again_of = self._rerun_times(plan, ctx)
        times = [0.0] * plan.pp
        params = [0.0] * plan.pp
        times[0] += pre.fwd_s + pre.bwd_s
        times[plan_last_stage(plan)] += post.fwd_s + post.bwd_s + post.tp_fwd_s + post.tp_bwd_s
        params[0] += pre.param_count
        params[plan_last_stage(plan)] += post.param_count
        reruns = chunk_forward_reruns(plan) if again_of else ()  # each chunk's (reruns.py), where it recomputes
        for index, (stage, chunk) in enumerate(zip(plan_chunk_stages(plan, len(stages)), stages)):
            times[stage] += sum(map(times_of.__getitem__, chunk))  # in the chunk's order, as a generator would
            params[stage] += sum(map(params_of.__getitem__, chunk))
            if not again_of:
                continue
            more = (reruns[index] if index < len(reruns) else plan_forward_reruns(plan, index)) - 1.0  # beyond one
            if more:
                times[stage] += more * sum(map(again_of.__getitem__, chunk))
        return times, params

    def _rerun_times(self, plan: Plan, ctx: TPContext) -> dict[str, float]:
        """{block: one forward re-run's seconds (cost/pp/partition.py rerun_s)} of ``plan``'s blocks, memoised per
        tp_plan; empty without recomputation."""
        if plan.recompute == "none":
            return {}

        def make() -> dict[str, float]:
            blocks = self.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            return dict(zip(blocks, per_distinct(list(blocks.values()), lambda b: rerun_s(b, plan.recompute))))

        return self._memo.get(("rerun", *ctx.key, plan.recompute, plan.tp_comm_overlap), plan.tp_plan, make)

    def bubble_floor(self, plan: Plan, *, may_offload: bool = True) -> float:
        """Micro-batches of the slowest stage's time (stage_totals') ``plan``'s bubble is at least
        (cost/pp/schedule.py:bubble_floor), a zero-bubble schedule's from its blocks' (T - 2W - R) / T with the most
        re-runs R a chunk makes (cost/pp/zero_bubble.py bubble_share: the replay's bubble is at least (p - 1)/v
        (F + B - W) without re-runs, cost/pp/looped_replay.py), a V schedule's
        from their forward share (:meth:`_forward_share`; 0 where the plan ``may_offload`` its activations:
        the copies join T, not the forward)."""

        def make() -> float:  # each distinct summary once: the share is the least of the parts' own (bubble_share)
            summaries = self.cost_model.block_summaries(plan.tp_plan, ctx := self.context(plan), plan.tp_comm_overlap)
            pre, post = self.cost_model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            rc, blocks = plan.recompute, {id(b): b for b in summaries.values()}.values()  # a group's blocks share one
            parts = [(block_time_s(b, rc, most), b.wgrad_s, most * rerun_s(b, rc)) for b in blocks]
            outside = [(pre.fwd_s + pre.bwd_s, pre.wgrad_s, 0.0), (post.fwd_s + post.bwd_s, post.wgrad_s, 0.0)]
            return bubble_share(parts + outside)

        share = forward_share = 0.0
        if self.bubble_reads_context(plan, may_offload=may_offload):
            if plan.schedule == "interleaved_zb":
                # a block re-runs at most as often as chunk 1 (every chunk but chunk 0's alike: cost/pp/reruns.py)
                most = plan_forward_reruns(plan, 1) if plan.recompute != "none" else 0.0
                key = ("bubble_share", *self.context(plan).key, plan.recompute, plan.tp_comm_overlap, most)
                share = self._memo.get(key, plan.tp_plan, make)
            else:
                forward_share = self._forward_share(plan)
        return bubble_floor(
            schedule=plan.schedule,
            pp=plan.pp,
            virtual_stages=plan.virtual_stages,
            share=share,
            forward_share=forward_share,
        )

    @staticmethod
    def bubble_reads_context(plan: Plan, *, may_offload: bool = True) -> bool:
        """Whether :meth:`bubble_floor` reads ``plan``'s blocks (its tp context, its ZeRO stage among it, recompute and
        tp_plan): a zero-bubble schedule's W share or a V's forward share at pp > 1; else only its schedule, pp and
        virtual stages."""
        return plan.pp > 1 and (plan.schedule == "interleaved_zb" or (v_shaped(plan.schedule) and not may_offload))

    def _forward_share(self, plan: Plan) -> float:
        """A floor on f / T of every stage of ``plan`` (cost/pp/replay.py v_forward_share): each block with all the
        forward its recompute re-runs, at the most re-runs any chunk makes (cost/pp/reruns.py; cost/stages.py
        add_block: a budget recomputes fewer), the outside nodes with none."""

        def make() -> float:  # each distinct summary once: the share is the least of the parts' own (v_forward_share)
            summaries = self.cost_model.block_summaries(plan.tp_plan, ctx := self.context(plan), plan.tp_comm_overlap)
            pre, post = self.cost_model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            rerun = {"full": lambda b: b.fwd_s, "selective": lambda b: b.selective_recompute_s}
            again = rerun.get(plan.recompute, lambda b: 0.0)
            parts = [(b.fwd_s, b.bwd_s, most * again(b)) for b in {id(b): b for b in summaries.values()}.values()]
            return v_forward_share(parts + [(pre.fwd_s, pre.bwd_s, 0.0), (post.fwd_s, post.bwd_s, 0.0)])

        most = max(chunk_forward_reruns(plan))  # a stage re-runs a block at most this often (reruns.py)
        key = ("forward_share", *self.context(plan).key, plan.recompute, plan.tp_comm_overlap, most)
        return self._memo.get(key, plan.tp_plan, make)

    def slowest_stage_floor_s(self, plan: Plan) -> float:
        """A floor on the largest of stage_totals' times under any partition: their mean, since the
        stages share every block and the outside nodes between them."""
        times_of, _, pre, post = self._block_totals(plan, self.floor_context(plan))
        outside_s = pre.fwd_s + pre.bwd_s + post.fwd_s + post.bwd_s + post.tp_fwd_s + post.tp_bwd_s
        return (sum(times_of.values()) + outside_s) / plan.pp

    def floor_context(self, plan: Plan) -> TPContext:
        """:meth:`context` with every activation at the precision's bytes: a floor of the run dtypes of each
        of ``plan``'s ZeRO variants, which the search bounds together (cost/compute/dtypes.py: autocast keeps
        fp32 where FSDP2's cast weights do not, and neither goes below the precision)."""
        return self._contexts_of(plan)[1]

    def _block_totals(self, plan: Plan, ctx: TPContext) -> tuple:
        """({block: time}, {block: parameters}, pre, post) of ``plan``'s blocks, memoised per tp_plan."""

        def make() -> tuple:
            blocks = self.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            pre, post = self.cost_model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            times = per_distinct(list(blocks.values()), lambda b: block_time_s(b, plan.recompute))  # a group's one
            params = {layer: b.param_count - b.expert_param_count for layer, b in blocks.items()}
            return dict(zip(blocks, times)), params, pre, post

        key = ("totals", *ctx.key, plan.recompute, plan.tp_comm_overlap)
        return self._memo.get(key, plan.tp_plan, make)

    def sync_params(self, plan: Plan) -> tuple[float, float]:
        """(parameters of the nodes before the first block, the fewest dense ones any block holds, the
        nodes after the last block included: they are the last block of the last stage); counted at
        floor_context, whose summaries the bounds share: a parameter count reads no activation dtype."""
        pre, _, _, smallest = self._param_counts(plan)
        return pre, smallest

    def single_stage_blocks(self, plan: Plan) -> tuple[LayerSummary, ...]:
        """The summaries CostModel's one pipeline stage holds at pp = 1, in forward order: the nodes
        before the first block, every block, the nodes after the last (CostModel._sum_stages)."""
        ctx = self.context(plan)

        def make() -> tuple[LayerSummary, ...]:
            blocks = self.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            pre, post = self.cost_model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            return (pre, *(blocks[layer] for layer in self.graph.layers), post)

        return self._memo.get(("one stage", *ctx.key, plan.tp_comm_overlap), plan.tp_plan, make)

    def kept_bytes_total(self, plan: Plan) -> KeptBytes:
        """:class:`KeptBytes` of ``plan`` under its recompute, at floor_context's activation bytes, a floor of every
        run dtype."""
        ctx = self.floor_context(plan)

        def make() -> KeptBytes:
            blocks = self.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap).values()
            return kept_of(blocks, *self.cost_model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap), plan)

        return self._memo.get(("kept", *ctx.key, plan.recompute, plan.tp_comm_overlap), plan.tp_plan, make)

    def param_parts(self, plan: Plan) -> tuple[float, float, float]:
        """(parameters of the nodes before the first block, after the last block, of all blocks),
        per device; counted at floor_context (sync_params)."""
        return self._param_counts(plan)[:3]

    def _param_counts(self, plan: Plan) -> tuple[float, float, float, float]:
        """(pre's parameters, post's, all blocks' dense ones, the fewest dense ones of any block or post) at
        floor_context, memoised per tp_plan on the context and tp_comm_overlap: the summaries' parameter counts
        read no recompute (a search asks ~46,000 times on DeepSeek-V3, its recompute choices apart)."""
        ctx = self.floor_context(plan)

        def make() -> tuple[float, float, float, float]:
            blocks = self.cost_model.block_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            pre, post = self.cost_model.outside_summaries(plan.tp_plan, ctx, plan.tp_comm_overlap)
            dense = [b.param_count - b.expert_param_count for b in blocks.values()]
            return pre.param_count, post.param_count, sum(dense), min([*dense, post.param_count])

        return self._memo.get(("params", *ctx.key, plan.tp_comm_overlap), plan.tp_plan, make)

    def min_boundary_bytes(self, plan: Plan) -> tuple[float, float]:
        """The smallest block inputs, forward and those whose gradient goes back (rotary tables and
        masks do not): lower bounds on what a pipeline stage receives and sends back per micro-batch."""
        ctx = self.floor_context(plan)
        key = ("boundary", *ctx.key)

        def make() -> tuple[float, float]:
            sizes = [self.cost_model.block_inputs(layer, plan, in_precision=True) for layer in self.graph.layers]
            return min((sum(b.sent) for b in sizes), default=0.0), min((sum(b.returned) for b in sizes), default=0.0)

        return self._memo.get(key, plan.tp_plan, make)


@dataclass(frozen=True)
class _ProblemBlocks:
    """What :meth:`StageCosts.problem` reads of a plan's blocks, per block in the graph's order."""

    times: tuple[float, ...]
    static: tuple[float, ...]
    acts: tuple[float, ...]
    peak_block: float
    boundary: tuple[float, float]  # the largest block input after the first and its gradients (D, D_g)
    inputs: tuple[tuple[float, float], ...]  # the blocks' after the first, and their gradients
    most_params: float
    pre: LayerSummary
    post: LayerSummary


class _StaticBytes:
    """A block's model-state bytes per device under ``plan`` (cost/memory/per_device.py): trainable
    parameters their weights, gradients and optimizer state, frozen ones their weights only; the
    routed experts' sharded over dp / ep."""

    def __init__(self, plan: Plan):
        self.dense_bytes = (state_bytes_per_param(plan), state_bytes_per_param(plan, trainable=False))
        edp = expert_dp(plan)
        self.expert_bytes = (state_bytes_per_param(plan, dp=edp), state_bytes_per_param(plan, dp=edp, trainable=False))
        self.rates = (*self.dense_bytes, *self.expert_bytes)  # all the bytes below read of the plan

    def dense(self, block: LayerSummary, *, experts_apart: bool = False) -> float:
        """All of ``block``'s parameters at the dense rate, or without its routed experts'."""
        params, frozen = block.param_count, block.frozen_param_count
        if experts_apart:
            params, frozen = params - block.expert_param_count, frozen - block.frozen_expert_param_count
        return (params - frozen) * self.dense_bytes[0] + frozen * self.dense_bytes[1]

    def experts(self, block: LayerSummary) -> float:
        frozen = block.frozen_expert_param_count
        return (block.expert_param_count - frozen) * self.expert_bytes[0] + frozen * self.expert_bytes[1]
