"""Sequence parallelism's once-a-step gradient all-reduce.

Under sequence parallelism a parameter used on sequence shards (a norm's weight, a rowwise
linear's bias) gets a partial gradient on every tp rank (Korthikanti et al. 2022, section 4.2.2),
all-reduced in fp32 once a step:

    t_sp = max_stage sum_{w in sp_partial_params(stage)} all_reduce(4 * elements_w, group = tp)

The routed experts leave it under their own layout (``ep * expert_tp > 1``, types/expert_layout.py).
"""

from __future__ import annotations

from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.tp.block import STREAM_KINDS, analyse_block
from autoplan.cost.tp.plan_memo import TpPlanMemo
from autoplan.types.expert_layout import experts_apart
from autoplan.types.graph import Graph
from autoplan.types.layout import stage_of_chunk
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.schedules import plan_last_stage, v_shaped


def sp_partial_params(
    graph: Graph, layer: str | None, tp_plan: dict[str, str], *, tp: int, sequence_parallel: bool
) -> list[str]:
    """Parameters whose gradient comes out as a partial sum over the tp group under sequence
    parallelism, and is all-reduced once a step (autoplan/execute/tensor_parallel.py
    ``finalize_tp_grads``; Megatron-LM all-reduces the same sequence-parallel parameters'
    gradients): the weights of norms, which each rank applies to its sequence shard whether or
    not the plan names them, and of replicated embeddings whose output joins the sequence-sharded
    stream (a replicated linear gets its output's gradient whole: autoplan/cost/tp/splits.py
    ``settled``); and every weight of an MoE block, which runs on the sequence shard
    (tp_block.token_wise_nodes; Megatron-Core marks its router's weight ``sequence_parallel`` and
    reduces its experts' gradients over a group that holds the tp ranks at expert-tensor-parallel size 1)."""
    if tp <= 1 or not sequence_parallel:
        return []
    block = analyse_block(graph, layer)
    found = []
    for node in block.nodes:
        if node.name in block.token_wise:
            found += [name for name in node.param_names if name not in found]
            continue
        split = tp_plan.get(node.module, "replicate") if node.module else "replicate"
        on_stream = node.name in block.sinks and node.name not in block.output_sinks
        runs_on_shard = split == "sequence_parallel" or node.op in STREAM_KINDS  # norms, on the sequence shard
        if runs_on_shard or (node.name in block.params and split == "replicate" and on_stream and node.op != "linear"):
            found += [name for name in node.param_names if name not in found]
    return found


class SequenceParallelSync:
    """The SP gradient sync of one graph (module docstring), memoised on what it reads."""

    def __init__(self, graph: Graph, profile: Profile):
        self.graph, self.profile = graph, profile
        self._names: dict[tuple, tuple[str, ...]] = {}  # (layer, tp, the layer's splits) -> sp_partial_params
        self._modules_of: dict[str | None, tuple[str, ...]] = {}
        self._worst = TpPlanMemo()

    def partial_elements(self, plan: Plan, tp_plan: dict[str, str], layers: list[str | None]) -> list[float]:
        """Elements of each parameter of ``layers`` (None: the outside nodes) whose gradient is
        all-reduced once a step under sequence parallelism (sp_partial_params), by name; a frozen
        one has no gradient to reduce."""
        params = self.graph.parameters
        names = {n for layer in layers for n in self._partial_names(layer, tp_plan, plan)}
        names -= self._routed_experts() if experts_apart(plan) else set()  # they sync over edp (expert_layout.py)
        return [float(params[n].numel) for n in sorted(names) if n in params and params[n].trainable]

    def _routed_experts(self) -> set[str]:
        """The routed experts' parameters: under the experts' own layout they are split over ep x etp and
        reduced over edp, which spans the tp ranks, instead of SP's all-reduce."""
        return {name for moe in self.graph.moe_layers for name in moe.expert_param_names}

    def _partial_names(self, layer: str | None, tp_plan: dict[str, str], plan: Plan) -> tuple[str, ...]:
        """sp_partial_params, memoised on what it reads: the layer, tp, SP and the splits of the
        layer's own modules (so two tp_plans that agree on the layer share it)."""
        if plan.tp <= 1 or not plan.sequence_parallel:
            return ()
        key = (layer, plan.tp, tuple(tp_plan.get(m) for m in self._layer_modules(layer)))
        hit = self._names.get(key)
        if hit is None:
            hit = self._names[key] = tuple(
                sp_partial_params(self.graph, layer, tp_plan, tp=plan.tp, sequence_parallel=True)
            )
        return hit

    def _layer_modules(self, layer: str | None) -> tuple[str, ...]:
        if layer not in self._modules_of:
            self._modules_of[layer] = tuple(
                sorted({n.module for n in analyse_block(self.graph, layer).nodes if n.module})
            )
        return self._modules_of[layer]

    def grad_sync_s(self, plan: Plan, tp_plan: dict[str, str], chunks: list[list[str]], tp_group: AxisGroup) -> float:
        """t_sp (module docstring) of ``plan`` priced with ``tp_plan``, its pipeline ``chunks`` on their
        stages (the last stage also holds the outside nodes)."""
        if plan.tp == 1 or not plan.sequence_parallel:
            return 0.0
        key = (plan.tp, plan.pp, v_shaped(plan.schedule), tuple(tuple(chunk) for chunk in chunks), tp_group)
        return self._worst.get(key, tp_plan, lambda: self._worst_stage_s(plan, tp_plan, chunks, tp_group))

    def _worst_stage_s(self, plan: Plan, tp_plan: dict[str, str], chunks: list[list[str]], group: AxisGroup) -> float:
        worst = 0.0
        for stage in range(plan.pp):
            layers = [
                layer
                for c, chunk in enumerate(chunks)
                if stage_of_chunk(c, pp=plan.pp, v_shape=v_shaped(plan.schedule)) == stage
                for layer in chunk
            ]
            elements = self.partial_elements(plan, tp_plan, layers + ([None] if stage == plan_last_stage(plan) else []))
            worst = max(worst, sum(collective_time_s(self.profile, "all_reduce", e * 4, group=group) for e in elements))
        return worst
