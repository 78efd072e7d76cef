"""A plan for another device count, for a run that continues from a checkpoint.

``replan(checkpoint, devices=N)`` reads the plan and model file the checkpoint records and
searches the best plan for N devices with the same global batch (the planner accumulates over
micro-batches where dp no longer covers it), on the profile the old plan was priced with unless
another is given. The checkpoint then loads into the new plan, resharded
(autoplan/execute/checkpoint/state.py), and the run continues with the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import CheckpointError
from autoplan.execute.checkpoint import store
from autoplan.types.plan import Plan


@dataclass
class Replanned:
    """A plan search for another device count from a checkpoint: the search ``result`` (``.best``
    is the plan), the ``graph`` and ``profile`` it searched, and the checkpoint it started from."""

    result: Any
    graph: Any
    profile: Any
    step_dir: Path
    info: store.CheckpointInfo
    model_file: Path

    @property
    def best(self) -> Plan:
        return self.result.best


def replan(
    checkpoint: str | Path, *, devices: int, profile: Any = None, model: str | Path | None = None, **options: Any
) -> Replanned:
    """The best plan for ``devices`` devices (module docstring); ``model`` overrides the model file
    the checkpoint records (it moved)."""
    step_dir = store.find_checkpoint(checkpoint)
    info = store.read_info(step_dir)
    model_file = Path(model) if model else Path(info.model_file)
    if not model_file.is_file():
        raise CheckpointError(
            f"checkpoint '{step_dir}' was written for model file '{info.model_file}', which does not exist here; "
            "pass the model file with --model."
        )
    result, graph, resolved = search(
        model=model_file, plan=Plan.from_dict(info.plan), devices=devices, profile=profile, **options
    )
    return Replanned(result, graph, resolved, step_dir, info, model_file)


def replan_plan(*, model: str | Path, plan: Plan, devices: int) -> Plan:
    """The best plan for ``devices`` devices with ``plan``'s global batch, profile and routing."""
    return search(model=model, plan=plan, devices=devices)[0].best


def search(*, model: str | Path, plan: Plan, devices: int, profile: Any = None, **options: Any) -> tuple:
    """(search result, graph, profile) for ``devices`` devices at ``plan``'s global batch and routing.
    FP8 is searched when ``options`` say ``allow_fp8=True``, or (``allow_fp8`` absent or None) when
    the old plan searched it or ran it: the run keeps the numerics it was trained with."""
    from autoplan.solve.api import plan_graph, profile_file, resolve_profile
    from autoplan.trace import trace_model_file

    chosen = profile or plan.profile
    if not chosen:
        raise CheckpointError("the checkpoint's plan records no profile; pass one with --profile.")
    resolved = resolve_profile(chosen)
    if options.get("allow_fp8") is None:
        options["allow_fp8"] = allowed_fp8(plan)
    graph = trace_model_file(str(model), plan.global_batch_size, routing=plan.routing)
    result = plan_graph(graph, devices=devices, profile=resolved, batch_size=plan.global_batch_size, **options)
    if isinstance(chosen, str) and (source := profile_file(chosen)) is not None:
        result.best.profile = source
    return result, graph, resolved


def allowed_fp8(plan: Plan) -> bool:
    """Whether ``plan``'s search could pick FP8: it ran FP8, or it searched it (``--allow-fp8``)."""
    searched = plan.predicted.search if plan.predicted else None
    return plan.precision == "fp8" or bool(searched and searched.allow_fp8)
