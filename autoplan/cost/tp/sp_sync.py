"""Sequence parallelism's once-a-step gradient all-reduce, as CostModel prices it.

Under sequence parallelism a parameter used on sequence shards (a norm's weight, a rowwise
linear's bias) gets a partial gradient on every tp rank, all-reduced in fp32 once a step on the
stage that holds the most of them (sp_partial_params; Korthikanti et al. 2022
section 4.2.2). :class:`SequenceParallelSync` holds that term for
:class:`autoplan.cost.model.CostModel`, memoised on what it reads.
"""

from __future__ import annotations

from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.tp.block import STREAM_KINDS, analyse_block
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan


def sp_partial_params(
    graph: Graph, layer: str | None, tp_plan: dict[str, str], *, tp: int, sequence_parallel: bool
) -> list[str]:
    """Parameters whose gradient comes out as a partial sum over the tp group under sequence
    parallelism, and is all-reduced once a step (autoplan/execute/tensor_parallel.py
    ``finalize_tp_grads``; Megatron-LM all-reduces the same sequence-parallel parameters'
    gradients): the weights of norms, which each rank applies to its sequence shard whether or
    not the plan names them, and of replicated nodes whose output joins the sequence-sharded
    stream; and every weight of an MoE block, which runs on the sequence shard
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
        runs_on_shard = (
            split == "sequence_parallel" or node.op in STREAM_KINDS
        )  # norms run on the sequence shard under SP
        if runs_on_shard or (node.name in block.params and split == "replicate" and on_stream):
            found += [name for name in node.param_names if name not in found]
    return found


class SequenceParallelSync:
    """The SP gradient-sync term of CostModel (module docstring)."""

    def sp_partial_elements(self, plan: Plan, tp_plan: dict[str, str], layers: list[str | None]) -> list[float]:
        """Elements of each parameter of ``layers`` (None: the outside nodes) whose gradient is
        all-reduced once a step under sequence parallelism (sp_partial_params)."""
        params = self.graph.parameters
        names = {n for layer in layers for n in self._sp_partial_names(layer, tp_plan, plan)}
        return [float(params[n].numel) for n in sorted(names) if n in params]

    def _sp_partial_names(self, layer: str | None, tp_plan: dict[str, str], plan: Plan) -> tuple[str, ...]:
        """sp_partial_params, memoised on what it reads: the layer, tp, SP and the
        splits of the layer's own modules (so two tp_plans that agree on the layer share it)."""
        if plan.tp <= 1 or not plan.sequence_parallel:
            return ()
        modules = self._layer_modules(layer)
        key = (layer, plan.tp, tuple(tp_plan.get(m) for m in modules))
        hit = self._sp_names.get(key)
        if hit is None:
            hit = self._sp_names[key] = tuple(
                sp_partial_params(self.graph, layer, tp_plan, tp=plan.tp, sequence_parallel=True)
            )
        return hit

    def _layer_modules(self, layer: str | None) -> tuple[str, ...]:
        if layer not in self._modules_of:
            self._modules_of[layer] = tuple(
                sorted({n.module for n in analyse_block(self.graph, layer).nodes if n.module})
            )
        return self._modules_of[layer]

    def _sp_grad_sync_s(self, plan: Plan, tp_group: AxisGroup) -> float:
        """Once a step, the all-reduce of each sequence-parallel parameter's fp32 gradient, on the
        stage that holds the most of them (sp_partial_params)."""
        if plan.tp == 1 or not plan.sequence_parallel:
            return 0.0
        tp_plan = self._tp_plan(plan)
        chunks = tuple(tuple(chunk) for chunk in self._chunks(plan))
        return self._memo.get(
            ("sp sync", plan.tp, plan.pp, chunks, tp_group),
            tp_plan,
            lambda: self._sp_grad_sync_worst_s(plan, tp_plan, tp_group),
        )

    def _sp_grad_sync_worst_s(self, plan: Plan, tp_plan: dict[str, str], tp_group: AxisGroup) -> float:
        worst = 0.0
        for stage in range(plan.pp):
            layers = self.stage_layers(plan, stage) + ([None] if stage == plan.pp - 1 else [])
            elements = self.sp_partial_elements(plan, tp_plan, layers)
            worst = max(worst, sum(self._collective_s("all_reduce", e * 4, tp_group, None) for e in elements))
        return worst
