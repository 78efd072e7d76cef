"""The best plan for another device count, keeping an old plan's global batch, profile, routing
and numerics: what ``autoplan replan`` (from a checkpoint, autoplan/cli/checkpoints.py) and
``autoplan run --elastic`` (a job restarted on fewer or more nodes, autoplan/cli/rank.py) search.

The planner accumulates over micro-batches where dp no longer covers the global batch; the
checkpoint then loads into the new plan, resharded (autoplan/execute/checkpoint/state.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan.errors import CheckpointError
from autoplan.types.plan import Plan


def replan_plan(*, model: str | Path, plan: Plan, devices: int) -> Plan:
    """The best plan for ``devices`` devices with ``plan``'s global batch, profile and routing."""
    return search(model=model, plan=plan, devices=devices)[0].best


def search(*, model: str | Path, plan: Plan, devices: int, profile: Any = None, **options: Any) -> tuple:
    """(search result, graph, profile) for ``devices`` devices at ``plan``'s global batch and routing, in its
    precision and gradient reduction dtype (:func:`numerics_pins`). FP8 is searched when ``options`` say
    ``allow_fp8=True``, or (``allow_fp8`` absent or None) when the old plan searched it or ran it: the run keeps
    the numerics it was trained with."""
    from autoplan.profile.io import load_profile, profile_file
    from autoplan.solve.api import plan_graph
    from autoplan.trace import trace_model_file

    chosen = profile or plan.profile
    if not chosen:
        raise CheckpointError("the checkpoint's plan records no profile; pass one with --profile.")
    resolved = load_profile(chosen)
    if options.get("allow_fp8") is None:
        options["allow_fp8"] = allowed_fp8(plan)
    options["fix"] = {**numerics_pins(plan, allow_fp8=options["allow_fp8"]), **(options.get("fix") or {})}
    if "reduce" in options["fix"]:  # the old run reduced in 16 bits: lossy, as it was allowed then
        options.setdefault("allow_lossy", True)
    graph = trace_model_file(str(model), plan.global_batch_size, routing=plan.routing)
    result = plan_graph(graph, devices=devices, profile=resolved, batch_size=plan.global_batch_size, **options)
    if isinstance(chosen, str) and (source := profile_file(chosen)) is not None:
        result.best.profile = source
    return result, graph, resolved


def numerics_pins(plan: Plan, *, allow_fp8: bool) -> dict:
    """The pins that keep ``plan``'s numerics: its precision (a replan of an fp32 run picked bf16 and the resumed
    losses drifted, 5.304708 against 5.304728), but for the choice between bf16 and FP8 where FP8 is searched
    (:func:`search`), and the dtype its gradients were reduced in where that was not fp32."""
    pins: dict = {} if allow_fp8 and plan.precision in ("bf16", "fp8") else {"precision": plan.precision}
    if plan.grad_reduce_dtype != "fp32":
        pins["reduce"] = plan.grad_reduce_dtype
    return pins


def allowed_fp8(plan: Plan) -> bool:
    """Whether ``plan``'s search could pick FP8: it ran FP8, or it searched it (``--allow-fp8``)."""
    searched = plan.predicted.search if plan.predicted else None
    return plan.precision == "fp8" or bool(searched and searched.allow_fp8)
