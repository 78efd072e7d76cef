"""What the step charges a node's parameters once a step, per split: the intra-op ILP's step term (docs/ilp.md, 2).

The block ILP (solve/intra_op.py) minimises a block's seconds per micro-batch, but a split also sets how many
parameters a rank holds, and so what the step pays for them outside the micro-batch loop: their data-parallel
messages (cost/dp/messages.py ``dp_messages`` of the plan as its weights see it, cost/cp/weights.py, each priced as
cost/dp/sync.py prices a block's: ``message_s`` of the unit's bytes on the dp shard group, HSDP's replica all-reduce
on the replicate group) and their optimizer step (CostModel's ``ADAM_BYTES_PER_PARAM`` pass, ``memory_time_s``, over
``dense_optimizer_params``' share). For P trainable and F frozen parameters on one rank, m micro-batches a step:

    step_s(P, F) = sum_msg times_per_step(msg) * least_exposed(msg, message_s(msg, bytes_msg(P + F, F), group_msg))
                   + memory_time_s(ADAM_BYTES_PER_PARAM * P / d)            d = dp under ZeRO >= 1, else 1
    per micro-batch: step_s / m    (the ILP's objective is a micro-batch's seconds; the step repeats it m times)

``least_exposed`` (DataParallelTerms.least_exposed_s) is the message whole where the step never hides it (ZeRO-0/1's
sync after the backward, ZeRO-1/2's gather after the step), else the (1 - eta) of it no overlap hides: what it
charges whatever the stages, which the ILP does not know. Dense parameters only: routed experts run at tp = 1, one
split each. Each message is priced alone (its own latency), which adds the same to every split of a node.
"""

from __future__ import annotations

from autoplan.cost.compute.roofline import memory_time_s
from autoplan.cost.cp.weights import weight_sync_plan
from autoplan.cost.dp.messages import dp_messages
from autoplan.cost.dp.sync import DataParallelTerms
from autoplan.cost.moe.placement import dense_optimizer_params
from autoplan.cost.network.mesh import plan_mesh_groups
from autoplan.cost.tp.block import analyse_block
from autoplan.cost.tp.shards import param_node_shards
from autoplan.cost.tp.splits import TPContext, legal_splits
from autoplan.types.graph import Graph
from autoplan.types.hsdp import shard_view
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


class ParamStepPrice:
    """:meth:`step_s` of one plan's ZeRO stage, dp groups and micro-batches (module docstring); ``step_key`` holds
    every value :meth:`step_s` reads but the profile and the dp terms (one planner's), ``key`` that and the
    micro-batches a step (the per micro-batch term's divisor)."""

    def __init__(self, plan: Plan, profile: Profile, dp_terms: DataParallelTerms):
        from autoplan.cost.model import ADAM_BYTES_PER_PARAM  # the model module imports this package

        weights = weight_sync_plan(plan)  # gradients sync over dp x cp
        groups = plan_mesh_groups(profile, plan)
        self.profile, self.dp_terms, self.adam_bytes = profile, dp_terms, ADAM_BYTES_PER_PARAM
        self.optimizer_plan = shard_view(weights)  # HSDP's optimizer shards over the shard group
        self.num_microbatches = plan.num_microbatches
        self.sends = tuple(
            (message, groups["dp_replicate"] if message.replicas else groups["dp_shard"], weights)
            for message in dp_messages(weights, backend=profile.backend)
        )
        sent = tuple(
            (message, group, message.times_per_step(plan.num_microbatches), dp_terms.least_exposed_s(w, message, 1.0))
            for message, group, w in self.sends
        )
        self.step_key = (sent, self.optimizer_plan.zero_stage >= 1, self.optimizer_plan.dp)  # what step_s reads
        self.key = (self.step_key, self.num_microbatches)

    def step_s(self, trainable: float, frozen: float) -> float:
        """Seconds a step charges ``trainable`` + ``frozen`` parameters held on one rank (module docstring)."""
        total_s = 0.0
        for message, group, weights in self.sends:
            if sent := message.sent(trainable + frozen, frozen):
                once_s = self.dp_terms.message_s(message, message.unit_bytes(sent), group)
                exposed_s = self.dp_terms.least_exposed_s(weights, message, once_s)
                total_s += message.times_per_step(self.num_microbatches) * exposed_s
        local = dense_optimizer_params(self.optimizer_plan, trainable)
        return total_s + memory_time_s(self.profile, local * self.adam_bytes)


def block_step_s(
    graph: Graph, layer: str | None, ctx: TPContext, step: ParamStepPrice, *, ranks: tuple | None = None
) -> dict[str, dict[str, float]]:
    """Per parameterised node of block ``layer`` with more than one legal split and per split, ``step``'s seconds
    a step for the node's own parameters at that split (:func:`rank_params`; ``ranks``: its answer for the block, tp
    and SP when kept), each distinct count priced once; the ILP's term is these over ``step.num_microbatches``
    (module docstring)."""
    prices: dict[tuple[float, float], float] = {}
    out = {}
    if ranks is None:
        ranks = rank_params(graph, layer, tp=ctx.tp, sequence_parallel=ctx.sequence_parallel)
    for name, splits in ranks:
        out[name] = {}
        for split, held in splits:
            if held not in prices:
                prices[held] = step.step_s(*held)
            out[name][split] = prices[held]
    return out


def rank_params(graph: Graph, layer: str | None, *, tp: int, sequence_parallel: bool) -> tuple:
    """Per parameterised node of block ``layer`` with more than one legal split, per split, the (trainable, frozen)
    parameters of its own (those no earlier node of the block holds, as price_block counts them) a rank holds at
    that split's parameter shard (cost/tp/shards.py ``param_node_shards``)."""
    block, seen, out, sp = analyse_block(graph, layer), set(), [], sequence_parallel and tp > 1
    for node in block.nodes:
        own = [p for p in node.param_names if p not in seen and p in graph.parameters]
        seen.update(own)
        legal = legal_splits(node, tp) if node.name in block.params else ()
        if len(legal) < 2:
            continue
        trainable = sum(graph.parameters[p].numel for p in own if graph.parameters[p].trainable)
        frozen = sum(graph.parameters[p].numel for p in own if not graph.parameters[p].trainable)
        shards = [(s, param_node_shards(block, node.name, s, tp=tp, sequence_parallel=sp)[1]) for s in legal]
        out.append((node.name, tuple((s, (trainable / shard, frozen / shard)) for s, shard in shards)))
    return tuple(out)
