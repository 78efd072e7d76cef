"""A plan's price per op: the rows of ops.csv (types/tables.py:PricedOp).

Times are per micro-batch on one device (forward + backward); bytes are per device. Compute and
saved bytes come from cost/compute/op_costs.py, which prices each op as cost/blocks.py does, so a
block's rows sum to what CostModel charges it (tests/unit/solve/test_solve_agreement.py). The
block's TP comm terms (cost/tp/splits.py) go to ops: a unary term to its op, an edge term to the
consuming op, an any-of term to the first consumer that triggers it, the SP all-gather of a stream
input to its first consumer, and SP's all-reduce of partial gradients (cost/tp/sp_sync.py) to the
first node that uses the parameter, spread over the micro-batches. Under context parallelism an
attention's exposed K,V time goes to its comm and the gathered K,V to its bytes (cost/cp/block.py),
and the states are sharded over dp x cp (cost/cp/weights.py).
"""

from __future__ import annotations

from autoplan.cost.blocks import block_structure, loss_grad_bytes
from autoplan.cost.compute.dtypes import RunDtypes, dtypes_of
from autoplan.cost.compute.op_costs import node_saved_bytes, node_time_s, node_times_s
from autoplan.cost.cp.block import BlockCp, context_parallel
from autoplan.cost.cp.exposed import attention_time_factor
from autoplan.cost.memory.per_device import model_states
from autoplan.cost.model import CostModel
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.tp.block import analyse_block
from autoplan.cost.tp.memory import param_copy_bytes, stream_copy_bytes
from autoplan.cost.tp.sp_sync import sp_partial_params
from autoplan.cost.tp.splits import block_terms, node_splits, tp_layer_cost
from autoplan.types.graph import Graph, OpNode
from autoplan.types.layout import stage_of_block
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.schedules import plan_last_stage, v_shaped
from autoplan.types.tables import PricedOp


def priced_ops(graph: Graph, profile: Profile, plan: Plan) -> list[PricedOp]:
    """One row per op of ``graph`` as the plan's runtime runs it (CostModel.for_runtime: an eager attention
    fused is one row), in graph order within each block (module docstring)."""
    model = CostModel(graph, profile).for_runtime(plan.runtime)
    graph, ctx = model.graph, model.tp_context(plan)
    dtypes = dtypes_of(graph, ctx.dtypes)  # each activation's run dtype (compute/dtypes.py)
    stages = dict(stage_of_block(plan.stages, pp=plan.pp, v_shape=v_shaped(plan.schedule)))
    first_block = next((i for i, n in enumerate(graph.nodes) if n.layer is not None), len(graph.nodes))
    nodes_of = _nodes_by_layer(graph)
    fractions = {part: CostModel.part_context(ctx, part).batch_fraction for part in ("pre", "")}
    last_stage = plan_last_stage(plan)
    rows = []
    for layer in [None, *graph.layers]:
        cost = tp_layer_cost(graph, layer, plan.tp_plan, ctx=ctx)
        comm = _comm_by_node(graph, layer, plan, ctx, nodes_of[layer])
        copies = stream_copy_bytes(
            graph,
            analyse_block(graph, layer),
            tp=plan.tp,
            sequence_parallel=plan.sequence_parallel,
            precision=plan.precision,
            dtypes=dtypes,
        )
        split_of = node_splits(graph, layer, plan.tp_plan, tp=plan.tp)
        structure = None  # the block's readers, for its loss nodes alone (loss_grad_bytes: 0 for the others)
        for index, node in nodes_of[layer]:
            stage = stages.get(layer, 0 if index < first_block else last_stage)
            shard = cost.compute_shard.get(node.name, 1)
            fraction = fractions["pre" if index < first_block else ""]
            compute = node_time_s(
                graph,
                node,
                profile,
                precision=plan.precision,
                batch_fraction=fraction,
                shard=shard,
                recipe=ctx.fp8,
                fused=ctx.fused,
                dtypes=dtypes,
            )
            state_bytes = _state_bytes(graph, node, plan, shard=cost.param_shard.get(node.name, 1))
            kv = _context_parallel(graph, node, profile, ctx, shard=shard)
            saved = node_saved_bytes(node, profile, precision=plan.precision, dtypes=dtypes)
            saved /= cost.activation_shard.get(node.name, 1)
            saved = (
                saved + copies.get(node.name, 0.0) + _param_copies(graph, layer, node, plan, split_of, dtypes)
            ) * fraction + kv.held_bytes
            if node.op == "loss":
                structure = structure or block_structure(graph, layer)
                gpu = profile.backend == "nccl"
                saved += loss_grad_bytes(structure, node, precision=plan.precision, gpu=gpu, dtypes=dtypes) * fraction
            split = (
                plan.tp_plan.get(node.module, "replicate")
                if node.module and node.op in ("linear", "embedding", "norm")
                else "-"
            )
            rows.append(
                PricedOp(
                    op=node.name,
                    kind=node.op,
                    module=node.module,
                    layer=layer or "",
                    stage=stage,
                    split=split,
                    compute_shard=shard,
                    compute_s=compute,
                    comm_s=comm.get(node.name, 0.0) + kv.fwd_s + kv.bwd_s,
                    param_state_bytes=state_bytes,
                    activation_bytes=int(saved),
                )
            )
    return rows


def _context_parallel(graph: Graph, node: OpNode, profile: Profile, ctx, *, shard: int) -> BlockCp:
    """An attention node's context-parallel terms as cost/blocks.py charges them (empty elsewhere)."""
    if ctx.cp == 1 or node.op != "attention":
        return BlockCp()
    times = node_times_s(
        graph,
        node,
        profile,
        precision=ctx.precision,
        batch_fraction=ctx.batch_fraction,
        shard=shard,
        dtypes=dtypes_of(graph, ctx.dtypes),
    )
    factor = attention_time_factor(ctx.cp, causal=bool(node.attrs.get("causal")))
    return context_parallel([(node, shard, times[0] * factor, times[1] * factor)], ctx, graph)


def _nodes_by_layer(graph: Graph) -> dict[str | None, list[tuple[int, OpNode]]]:
    """(position in the graph, node) of every node, by block (None: outside every block), in graph order."""
    found: dict[str | None, list[tuple[int, OpNode]]] = {layer: [] for layer in [None, *graph.layers]}
    for index, node in enumerate(graph.nodes):
        found.setdefault(node.layer, []).append((index, node))
    return found


def _param_copies(
    graph: Graph, layer: str | None, node, plan: Plan, split_of: dict[str, str], dtypes: RunDtypes | None
) -> float:
    if node.name not in split_of:
        return 0.0
    block = analyse_block(graph, layer)
    return param_copy_bytes(
        graph, block, node.name, split_of[node.name], tp=plan.tp, precision=plan.precision, dtypes=dtypes
    )


def _comm_by_node(
    graph: Graph, layer: str | None, plan: Plan, ctx, nodes: list[tuple[int, OpNode]]
) -> dict[str, float]:
    if plan.tp == 1:
        return {}
    terms = block_terms(graph, layer, ctx=ctx)
    splits = node_splits(graph, layer, plan.tp_plan, tp=plan.tp)
    comm: dict[str, float] = dict(terms.constant_at)
    for u, table in terms.unary.items():
        comm[u] = comm.get(u, 0.0) + sum(table[splits[u]])
    for (u, v), table in terms.pair.items():
        comm[v] = comm.get(v, 0.0) + sum(table[(splits[u], splits[v])])
    for (fwd, bwd), choices in terms.any_of:
        hit = next((v for v, s in choices if splits[v] == s), None)
        if hit is not None:
            comm[hit] = comm.get(hit, 0.0) + fwd + bwd
    for (fwd, bwd), (w, s_w), choices in terms.gated:
        if splits[w] == s_w and any(splits[v] == s for v, s in choices):
            comm[w] = comm.get(w, 0.0) + fwd + bwd
    partial = set(sp_partial_params(graph, layer, plan.tp_plan, tp=plan.tp, sequence_parallel=plan.sequence_parallel))
    for _, node in nodes:  # the step's all-reduce of partial gradients, spread over its micro-batches
        for name in sorted(partial.intersection(node.param_names)):
            partial.discard(name)  # once per parameter, on the first node that uses it
            seconds = collective_time_s(ctx.profile, "all_reduce", graph.parameters[name].numel * 4, group=ctx.group)
            comm[node.name] = comm.get(node.name, 0.0) + seconds / plan.num_microbatches
    return comm


def _state_bytes(graph: Graph, node: OpNode, plan: Plan, *, shard: int) -> int:
    """The weights, gradients and optimizer state of ``node``'s parameters on one device (cost/memory/per_device.py);
    0 for a node that holds none (most nodes: every term is a multiple of its parameter count)."""
    if not node.param_count:
        return 0
    params = node.param_count / shard
    states = model_states(
        params=params,
        precision=plan.precision,
        zero_stage=plan.zero_stage,
        dp=plan.dp * plan.cp,
        pp=plan.pp,
        trainable=params * _trained_share(graph, node),
        offload=plan.offload,
    )
    return int(states.weights_bytes + states.grads_bytes + states.optimizer_bytes)


def _trained_share(graph, node) -> float:
    """The share of ``node``'s named parameters that are trainable (1 when it names none)."""
    infos = [graph.parameters[p] for p in node.param_names if p in graph.parameters]
    total = sum(info.numel for info in infos)
    return sum(info.numel for info in infos if info.trainable) / total if total else 1.0
