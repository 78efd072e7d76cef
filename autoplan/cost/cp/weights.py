"""The ranks that hold the same weights under context parallelism (docs/cost-model.md, "Context parallelism").

cp ranks hold the same weights and compute gradients of different tokens, so their gradients are
summed over the dp x cp group and ZeRO shards over it, as torchtitan's FSDP does over its flattened
``dp_shard_cp`` mesh and Megatron-Core's distributed optimizer over its data-parallel-with-cp group
(``get_data_parallel_group(with_context_parallel=True)``). Every weight term (the dp/ZeRO messages of
cost/dp/, model states and buffers of cost/memory/, the optimizer step) therefore prices a plan with
cp = 1 and dp·cp data-parallel ranks; the batch a step trains stays the plan's (cp ranks share samples).
"""

from __future__ import annotations

import copy

from autoplan.types.plan import Plan


def weight_sync_plan(plan: Plan) -> Plan:
    """``plan`` as its weights see it: dp·cp data-parallel ranks and no cp (module docstring)."""
    if plan.cp == 1:
        return plan
    weights = copy.copy(plan)  # not replace(): the copy of a valid plan needs no re-check, and pricing asks often
    weights.dp, weights.cp = plan.dp * plan.cp, 1
    return weights
