"""The planner: legal per-op splits -> intra-op ILP per block group -> pipeline partition DP ->
outer search over dp x tp x pp, micro-batches, schedules, ZeRO, recomputation, sequence
parallelism and precision, every candidate priced by the cost model. See docs/ilp.md.

``plan(model, example_inputs, devices=..., profile=..., batch_size=...) -> Plan`` traces and
searches; ``plan_graph(graph, ...)`` searches an already traced graph and returns every candidate.
"""
from autoplan.solve.api import NoPlanFits, plan, plan_graph

__all__ = ["plan", "plan_graph", "NoPlanFits"]
