"""What solve/ (and report/, calibrate/, export/, cli/) may ask the cost model; docs/architecture.md,
"The planner's interface", says why it is narrow. tests/unit/test_layout.py checks that those stages
import cost/ only here (as ``autoplan.cost``) and that every name is asked for.

- a whole plan: ``CostModel(graph, profile)``: ``estimate(plan)`` (its memory alone: ``memory_alone``), the
  block summaries the partition balances, ``tp_context``, the expert ``placement``, each stage's priced memory,
  its op-time memo;
  ``Bounds``: floors on its step-time terms and memory that the search prunes with (cost/bounds.py);
- one block's splits for the intra-op ILP: ``price_block`` in a ``split_context``, within a
  ``memory_budget`` when a plan did not fit; ``analyse_block`` names a block's parameterised ops;
  ``ParamStepPrice``, ``block_step_s`` (of ``rank_params``): what the step charges each split's parameters a step;
  ``DtypePolicy`` and ``policy_for``: the run dtypes a ZeRO stage's plans price their splits in;
- one block of the pipeline partition: ``block_time_s``, ``rerun_s``, ``chunk_forward_reruns`` and
  ``plan_forward_reruns`` (re-runs per chunk: cost/pp/reruns.py), ``kept_bytes``, ``kept_of`` (``KeptBytes``),
  ``state_bytes_per_param``, ``cut_s``, ``stage_capacity_bytes``, ``in_flight_chunks``, ``balanced_stages``,
  ``bubble_floor``, ``bubble_share``, ``v_forward_share``; a held plan's floor on its own stages (``device_counts``,
  ``device_sent``, ``sent_bytes``, ``blocks_states_bytes``, ``schedule_key``: cost/memory/in_flight_floor.py);
- budgeted recompute: the fewest blocks per chunk that fit (``fit_recompute_blocks``), each stage's
  peak under a budget (``stage_peaks_bytes``);
- ops.csv's rows (``priced_ops``), the usable memory, what MoE layers allow (``moe_limits``, and
  ``A2A_EXPOSED_FLOOR``, the least share of the all-to-all an overlap leaves, ``a2a_paired_share``, a pair's
  phases ``a2a_pair_phases``), a PowerSGD rank (``check_rank``, ``compresses_any``), a precision's ``peak_dtype``;
- the whole run (``RunPricer``, ``run_pricer``, ``run_summary``, ``reliability_*``), the audit's predicted volumes
  (``predict_volumes``), what sparse embedding tables send (``sparse_grad_summary``), the search cache (``stored``).
"""

from __future__ import annotations

from autoplan.cost import stored
from autoplan.cost.blocks import LayerSummary, per_distinct
from autoplan.cost.bounds import Bounds
from autoplan.cost.compute.dtypes import DtypePolicy, policy_for
from autoplan.cost.compute.op_costs import NodeTimes
from autoplan.cost.compute.roofline import PRECISION_BYTES, peak_dtype
from autoplan.cost.dp.compression import check_rank, compresses_any
from autoplan.cost.dp.param_step import ParamStepPrice, block_step_s, rank_params
from autoplan.cost.dp.sparse_embedding import summary as sparse_grad_summary
from autoplan.cost.memory.alone import memory_alone
from autoplan.cost.memory.in_flight_floor import (
    KeptBytes,
    blocks_states_bytes,
    device_counts,
    device_sent,
    schedule_key,
    sent_bytes,
)
from autoplan.cost.memory.per_device import usable_bytes
from autoplan.cost.memory.recompute_budget import fit_recompute_blocks, stage_peaks_bytes
from autoplan.cost.model import CostModel
from autoplan.cost.moe.a2a_overlap import COMM_SM_SHARE as A2A_EXPOSED_FLOOR
from autoplan.cost.moe.a2a_overlap import paired_share as a2a_paired_share
from autoplan.cost.moe.a2a_overlap import stage_pair_phases as a2a_pair_phases
from autoplan.cost.moe.experts import moe_limits, pipeline_blocks
from autoplan.cost.network.mesh import plan_mesh_groups
from autoplan.cost.op_table import priced_ops
from autoplan.cost.pp.partition import (
    block_time_s,
    cut_s,
    kept_bytes,
    kept_of,
    rerun_s,
    stage_capacity_bytes,
    state_bytes_per_param,
)
from autoplan.cost.pp.replay import v_forward_share
from autoplan.cost.pp.reruns import chunk_forward_reruns, plan_forward_reruns
from autoplan.cost.pp.schedule import balanced_stages, bubble_floor, in_flight_chunks, stage_rerun_units
from autoplan.cost.pp.v_orders import v_order
from autoplan.cost.pp.zero_bubble import bubble_share
from autoplan.cost.run.reliability import not_priced_reason as reliability_not_priced
from autoplan.cost.run.reliability import prediction_fields as reliability_fields
from autoplan.cost.run.reliability import summary as reliability_summary
from autoplan.cost.run.whole_run import RunPricer, check_prices, dollars_per_sample, priced_profile, run_pricer
from autoplan.cost.run.whole_run import summary as run_summary
from autoplan.cost.tp.block import analyse_block
from autoplan.cost.tp.plan_memo import TpPlanMemo
from autoplan.cost.tp.shards import shard_dim
from autoplan.cost.tp.split_prices import BlockPrices, MemoryBudget, memory_budget, price_block, split_context
from autoplan.cost.tp.splits import TPContext
from autoplan.cost.volumes import predict as predict_volumes

__all__ = [
    "stored",  # the search cache (cost/stored.py)
    # a whole plan, and the floors the search prunes with
    "Bounds",
    "CostModel",
    "memory_alone",
    # one block's splits (the intra-op ILP)
    "BlockPrices",
    "DtypePolicy",
    "MemoryBudget",
    "ParamStepPrice",
    "analyse_block",
    "block_step_s",
    "rank_params",
    "memory_budget",
    "policy_for",
    "price_block",
    "shard_dim",
    "split_context",
    # one block of the pipeline partition
    "balanced_stages",
    "block_time_s",
    "rerun_s",
    "chunk_forward_reruns",
    "plan_forward_reruns",
    "cut_s",
    "in_flight_chunks",
    "bubble_floor",
    "bubble_share",
    "v_forward_share",
    "kept_bytes",
    "KeptBytes",
    "kept_of",
    "device_sent",
    "sent_bytes",
    "blocks_states_bytes",
    "device_counts",
    "schedule_key",
    "stage_capacity_bytes",
    "state_bytes_per_param",
    # ops.csv and memory
    "priced_ops",
    "usable_bytes",
    "sparse_grad_summary",
    # budgeted recompute: the fewest blocks per chunk that fit, and each stage's peak under a budget
    "fit_recompute_blocks",
    "stage_peaks_bytes",
    # what a model allows
    "check_rank",
    "moe_limits",
    "pipeline_blocks",
    "A2A_EXPOSED_FLOOR",  # the least share of an all-to-all its overlap leaves (cost/moe/a2a_overlap.py)
    "a2a_paired_share",  # the share of micro-batches the overlap pairs (same module)
    "a2a_pair_phases",  # a stage's pair in its four phases, as the predicted trace draws it (same module)
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
    "per_distinct",
    "PRECISION_BYTES",
    "TPContext",
    "TpPlanMemo",
    # what report/, calibrate/ and cli/ also ask
    "compresses_any",
    "peak_dtype",
    "plan_mesh_groups",
    "predict_volumes",
    "run_summary",
    "v_order",
    "stage_rerun_units",
]
