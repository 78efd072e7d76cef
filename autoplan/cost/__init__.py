"""Cost model: predict step time, memory and throughput of a plan on a profiled cluster.

Graph + Profile + Plan -> Cost, as plain functions with no process group:
``mesh`` places mesh axes on nodes, ``comm`` prices collectives, ``compute`` prices ops,
``tensor_parallel`` prices tensor-parallel blocks, ``layers`` summarises blocks, ``schedule``
and ``memory`` hold the pipeline and memory formulas, and ``model.CostModel`` assembles them.
``reliability`` prices checkpoints and failures: the checkpoint interval and expected goodput.
docs/cost-model.md states every formula with its source.
"""

from autoplan.cost.model import CostModel, estimate

__all__ = ["CostModel", "estimate"]
