"""One block's context parallelism, per micro-batch and rank: the messages of its attention calls
(autoplan/cost/cp/messages.py), their exposed time beside each call's compute
(autoplan/cost/cp/exposed.py) and the gathered K,V the backward holds (docs/cost-model.md,
"Context parallelism"). Read by cost/blocks.py; the audit reads ``messages`` (cost/volumes.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.compute.dtypes import dtypes_of
from autoplan.cost.cp.exposed import exposed_s
from autoplan.cost.cp.messages import CpMessage, attention_bytes, attention_messages, gathered_kv_bytes, ulysses_refusal
from autoplan.errors import PlanError
from autoplan.types.context_parallel import cp_divides, cp_refusal
from autoplan.types.graph import Graph, OpNode
from autoplan.types.plan import Plan


@dataclass(frozen=True)
class BlockCp:
    """A block's context-parallel terms for one micro-batch on one rank."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    held_bytes: float = 0.0  # gathered K,V held for the backward beyond the local shards
    messages: tuple[CpMessage, ...] = ()  # every attention call's, forward and backward


def context_parallel(attention: list[tuple[OpNode, int, float, float]], ctx, graph: Graph | None = None) -> BlockCp:
    """The terms of a block whose attention calls are ``attention`` ((node, tp shard, forward s,
    backward s) each) under ``ctx`` (a TPContext with cp > 1; an empty BlockCp otherwise); ``graph``
    gives K and V their run dtype (compute/dtypes.py)."""
    if ctx.cp == 1 or not attention:
        return BlockCp()
    fwd = bwd = held = 0.0
    sent: list[CpMessage] = []
    for node, shard, t_fwd, t_bwd in attention:
        tensors = attention_bytes(
            node,
            precision=ctx.precision,
            micro_batch_fraction=ctx.micro_batch_fraction,
            shard=shard,
            dtypes=dtypes_of(graph, ctx.dtypes) if graph is not None else None,
        )
        messages = attention_messages(ctx.cp_variant, cp=ctx.cp, tensors=tensors)
        kw = dict(profile=ctx.profile, group=ctx.cp_group, attention_fwd_s=t_fwd, attention_bwd_s=t_bwd)
        f, b = exposed_s(messages, **kw)
        fwd, bwd = fwd + f, bwd + b
        held += gathered_kv_bytes(ctx.cp_variant, cp=ctx.cp, tensors=tensors)
        sent += messages
    return BlockCp(fwd_s=fwd, bwd_s=bwd, held_bytes=held, messages=tuple(sent))


def check_context_parallel(graph: Graph, plan: Plan) -> None:
    """Raise PlanError with one sentence when ``graph`` cannot run ``plan``'s cp (types/context_parallel.py's
    rule, head-tail chunks of the sequence, and Ulysses' heads per tp rank divisible by cp)."""
    refusal = cp_refusal(graph)
    if refusal is None and not cp_divides(graph.seq_len, plan.cp):
        refusal = (
            f"cp={plan.cp} splits each sequence into {2 * plan.cp} equal chunks (head-tail load balancing), "
            f"and {graph.seq_len} tokens do not divide that way; use a cp with 2cp dividing the sequence."
        )
    if refusal is None and plan.cp_variant == "ulysses":
        attention = [n for n in graph.nodes if n.op == "attention"]
        refusal = next(
            (r for n in attention if (r := ulysses_refusal(n, cp=plan.cp, shard=_head_shard(n, plan.tp)))), None
        )
    if refusal:
        raise PlanError(refusal)


def _head_shard(node: OpNode, tp: int) -> int:
    """How many ways tensor parallelism splits ``node``'s heads: tp where it divides both head counts
    (the default and the ILP's splits shard q, k, v colwise then), else 1 (attention replicated)."""
    heads = node.attrs.get("num_heads") or 1
    kv_heads = node.attrs.get("num_kv_heads_at_call") or node.attrs.get("num_kv_heads") or heads  # as SDPA gets them
    return tp if heads % tp == 0 and kv_heads % tp == 0 else 1
