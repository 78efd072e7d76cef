"""A plan for another device count, for a run that continues from a checkpoint.

``replan(checkpoint, devices=N)`` reads the plan and model file the checkpoint records and
searches the best plan for N devices with the same global batch (the planner accumulates over
micro-batches where dp no longer covers it), on the profile the old plan was priced with unless
another is given. The checkpoint then loads into the new plan, resharded
(autoplan/execute/checkpoint/state.py), and the run continues with the same data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan.errors import CheckpointError
from autoplan.execute.checkpoint import store
from autoplan.types.plan import Plan


def replan(
    checkpoint: str | Path, *, devices: int, profile: Any = None, model: str | Path | None = None, **options: Any
) -> Any:
    """The planner's search result for ``devices`` devices (``.best`` is the plan); see the module docstring.
    ``model`` overrides the model file the checkpoint records (it moved)."""
    step_dir = store.find_checkpoint(checkpoint)
    info = store.read_info(step_dir)
    model_file = Path(model) if model else Path(info.model_file)
    if not model_file.is_file():
        raise CheckpointError(
            f"checkpoint '{step_dir}' was written for model file '{info.model_file}', which does not exist here; "
            "pass the model file with --model."
        )
    return search(model=model_file, plan=Plan.from_dict(info.plan), devices=devices, profile=profile, **options)


def replan_plan(*, model: str | Path, plan: Plan, devices: int) -> Plan:
    """The best plan for ``devices`` devices with ``plan``'s global batch, profile and routing."""
    return search(model=model, plan=plan, devices=devices).best


def search(*, model: str | Path, plan: Plan, devices: int, profile: Any = None, **options: Any) -> Any:
    from autoplan.solve.api import plan_graph, profile_file, resolve_profile
    from autoplan.trace import trace_model_file

    chosen = profile or plan.profile
    if not chosen:
        raise CheckpointError("the checkpoint's plan records no profile; pass one with --profile.")
    resolved = resolve_profile(chosen)
    graph = trace_model_file(str(model), plan.global_batch_size, routing=plan.routing)
    result = plan_graph(graph, devices=devices, profile=resolved, batch_size=plan.global_batch_size, **options)
    if isinstance(chosen, str) and (source := profile_file(chosen)) is not None:
        result.best.profile = source
    return result
