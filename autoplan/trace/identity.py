"""Is this the model a plan was made for? ``run``, ``launch`` and ``export --model`` ask before they act.

A plan records the model file's SHA-256 and the traced graph's signature (``Plan.model_sha256``,
``Plan.graph_signature``; :func:`autoplan.types.graph.parameters_signature`: every parameter's
name, shape and dtype). The rule:

- another signature: refused, one sentence. The plan's tp_plan and stages name modules and
  blocks, and its prices are for parameter shapes, of another model (a GPT plan given to a Llama,
  or the same file at other ``AUTOPLAN_*`` sizes, which the file's hash cannot see);
- the same signature from a changed file: a warning. The plan still names this model's modules;
  an edited comment changes nothing, while an edited forward may change the step time it priced;
- a plan without a signature (written before plans recorded one, or built by hand): not checked.

The signature is computed from the model built on the meta device (no trace, no memory), with
the tracer's own parameter table (trace/build.py), so both sides hash the same table.
"""

from __future__ import annotations

from pathlib import Path

import torch

from autoplan.errors import PlanError
from autoplan.modelfile import ModelFile, load_model_file
from autoplan.trace.build import parameter_table
from autoplan.types.graph import parameters_signature
from autoplan.types.plan import Plan


def model_signature(model_file: ModelFile) -> str:
    """The graph signature of ``model_file``'s model, built on the meta device."""
    with torch.device("meta"):
        model = model_file.build()
    return parameters_signature(parameter_table(model))


def check_plan_is_for(plan: Plan, model: str | Path | ModelFile, *, plan_name: str = "the plan") -> str | None:
    """Raise PlanError when ``plan`` was made for another model (module docstring); return a
    warning sentence when only the model file changed, else None."""
    if not plan.graph_signature:
        return None
    model_file = model if isinstance(model, ModelFile) else load_model_file(model)
    signature = model_signature(model_file)
    if signature != plan.graph_signature:
        raise PlanError(
            f"{plan_name} {_made_for(plan, model_file, signature)}; make a plan for it with `autoplan plan`."
        )
    if plan.model_sha256 and model_file.sha256 != plan.model_sha256:
        return (
            f"{model_file.path.name} changed since {plan_name} was made (the same parameters, so the plan applies; "
            "its predicted times may not, if the forward changed: re-plan to be sure)."
        )
    return None


def check_plan_is_for_module(plan: Plan, model: torch.nn.Module) -> None:
    """Raise PlanError when ``plan`` was made for another model than ``model`` (a module, as the Python API's
    ``parallelize`` takes it): its parameters' names and shapes give another signature. The CLI asks
    :func:`check_plan_is_for` of the model file; the API trained another model's plan silently."""
    if not plan.graph_signature:
        return
    signature = parameters_signature(parameter_table(model))
    if signature != plan.graph_signature:
        made_for = f"'{plan.model}'" if plan.model else "another model"
        raise PlanError(
            f"the plan was made for {made_for} (graph signature {plan.graph_signature}), not for this "
            f"{type(model).__name__} (graph signature {signature}: other parameter names or shapes); make a plan "
            "for it with autoplan.plan()."
        )


def _made_for(plan: Plan, model_file: ModelFile, signature: str) -> str:
    """The clause that says which model the plan is for and how this one differs."""
    name = model_file.path.name
    if plan.model == model_file.name:  # the same file name: other sizes (AUTOPLAN_* variables) or an edit
        return (
            f"was made for {name} with other parameters (graph signature {plan.graph_signature}, here {signature}: "
            "other sizes, such as its AUTOPLAN_* environment variables set, or an edited model)"
        )
    made_for = f"'{plan.model}'" if plan.model else "another model"
    return (
        f"was made for {made_for} (graph signature {plan.graph_signature}), not for {name} "
        f"(graph signature {signature}: other parameter names or shapes)"
    )
