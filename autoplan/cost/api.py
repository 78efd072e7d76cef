"""What the planner (solve/) may ask the cost model: the one module solve/ imports from cost/.

report/, calibrate/, export/ and cli/ ask through it too (a Cost to explain or refit, the audit's
predicted volumes: ``predict_volumes``, the whole run's line: ``run_summary``, a precision's
``peak_dtype``, whether PowerSGD ``compresses_any`` gradient).

Like autoparallel's optimizer, which sees only a strategy's runtime and communication cost, the
search never prices anything itself; it asks for these, each with explicit inputs:

- a whole plan: ``CostModel(graph, profile)``: ``estimate(plan)`` (the Cost every candidate is ranked
  by), the block summaries the partition balances (``block_summaries``, ``outside_summaries``,
  ``block_summary``, ``block_inputs``), ``tp_context``, the expert ``placement``, each stage's priced
  memory (``priced_stages``, ``stage_memory``) and its memo of op times (``node_times``);
- one block's splits, for the intra-op ILP: :func:`price_block` (:class:`BlockPrices`: each split's
  seconds and bytes, ``shard_dim`` for tied weights), in a :func:`split_context`, within a
  :func:`memory_budget` when a plan did not fit; :func:`analyse_block` names a block's parameterised ops;
- one block for the pipeline partition: :func:`block_time_s`, :func:`kept_bytes`,
  :func:`state_bytes_per_param`, :func:`cut_s`, :func:`stage_capacity_bytes`, :func:`in_flight_chunks`,
  and :func:`balanced_stages` when the partition is not searched;
- a plan's rows of ops.csv: :func:`priced_ops`; the memory a plan may use: :func:`usable_bytes`;
- which ep and pp a model's MoE layers allow (``moe_limits``, which also refuses a pin they cannot take;
  ``pipeline_blocks``) and whether a PowerSGD rank fits its matrices (``check_rank``);
- the whole run: ``RunPricer`` / ``run_pricer`` (hours and dollars), ``priced_profile``,
  ``check_prices``, ``dollars_per_sample``, and the checkpoint interval and goodput (``reliability_*``).

Types the answers come in: ``LayerSummary``, ``TPContext``, ``NodeTimes``, ``TpPlanMemo``.
The last group serves solve/bounds.py's lower bounds until it asks through the statement of messages
(issue 31 item 1); tests/unit/test_layout.py checks that solve/ imports cost/ only here and that
every name here is asked for.
"""

from __future__ import annotations

from autoplan.cost.blocks import LayerSummary
from autoplan.cost.compute.op_costs import NodeTimes
from autoplan.cost.compute.roofline import PRECISION_BYTES, peak_dtype
from autoplan.cost.dp.compression import check_rank, compresses_any
from autoplan.cost.memory.per_device import usable_bytes
from autoplan.cost.model import CostModel
from autoplan.cost.moe.experts import moe_limits, pipeline_blocks
from autoplan.cost.op_table import priced_ops
from autoplan.cost.pp.partition import block_time_s, cut_s, kept_bytes, stage_capacity_bytes, state_bytes_per_param
from autoplan.cost.pp.schedule import balanced_stages, in_flight_chunks
from autoplan.cost.run.reliability import not_priced_reason as reliability_not_priced
from autoplan.cost.run.reliability import prediction_fields as reliability_fields
from autoplan.cost.run.reliability import summary as reliability_summary
from autoplan.cost.run.whole_run import RunPricer, check_prices, dollars_per_sample, priced_profile, run_pricer
from autoplan.cost.run.whole_run import summary as run_summary
from autoplan.cost.tp.block import analyse_block
from autoplan.cost.tp.plan_memo import TpPlanMemo
from autoplan.cost.tp.split_prices import (
    BlockPrices,
    MemoryBudget,
    memory_budget,
    price_block,
    shard_dim,
    split_context,
)
from autoplan.cost.tp.splits import TPContext
from autoplan.cost.volumes import predict as predict_volumes

# isort: split
# solve/bounds.py's lower bounds, until it is switched to this interface (the lead prunes what it stops asking)
from autoplan.cost.compute.op_costs import node_time_s
from autoplan.cost.compute.roofline import memory_time_s
from autoplan.cost.memory.per_device import DDP_BUCKET_BYTES, STATE_BYTES, model_states
from autoplan.cost.model import ADAM_BYTES_PER_PARAM
from autoplan.cost.moe.experts import ExpertPlacement, a2a_times_s, grouped_gemm_s, is_expert_gemm, layers_in
from autoplan.cost.network.comm import bucketed_time_s, collective_time_s
from autoplan.cost.network.mesh import mesh_groups
from autoplan.cost.tp.block import STREAM_KINDS, BlockAnalysis
from autoplan.cost.tp.shards import pure_layouts_possible
from autoplan.cost.tp.splits import legal_splits

__all__ = [
    # a whole plan
    "CostModel",
    # one block's splits (the intra-op ILP)
    "BlockPrices",
    "MemoryBudget",
    "analyse_block",
    "memory_budget",
    "price_block",
    "shard_dim",
    "split_context",
    # one block of the pipeline partition
    "balanced_stages",
    "block_time_s",
    "cut_s",
    "in_flight_chunks",
    "kept_bytes",
    "stage_capacity_bytes",
    "state_bytes_per_param",
    # ops.csv and memory
    "priced_ops",
    "usable_bytes",
    # what a model allows
    "check_rank",
    "moe_limits",
    "pipeline_blocks",
    # the whole run
    "RunPricer",
    "check_prices",
    "dollars_per_sample",
    "priced_profile",
    "reliability_fields",
    "reliability_not_priced",
    "reliability_summary",
    "run_pricer",
    # types and shared constants
    "LayerSummary",
    "NodeTimes",
    "PRECISION_BYTES",
    "TPContext",
    "TpPlanMemo",
    # what report/, calibrate/ and cli/ also ask
    "compresses_any",
    "peak_dtype",
    "predict_volumes",
    "run_summary",
    # solve/bounds.py, until switched
    "ADAM_BYTES_PER_PARAM",
    "BlockAnalysis",
    "DDP_BUCKET_BYTES",
    "ExpertPlacement",
    "STATE_BYTES",
    "STREAM_KINDS",
    "a2a_times_s",
    "bucketed_time_s",
    "collective_time_s",
    "grouped_gemm_s",
    "is_expert_gemm",
    "layers_in",
    "legal_splits",
    "memory_time_s",
    "mesh_groups",
    "model_states",
    "node_time_s",
    "pure_layouts_possible",
]
