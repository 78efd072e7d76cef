"""What FP8 would gain, for a plan whose search did not consider it.

The planner searches FP8 linears only with ``--allow-fp8`` or a ``precision=fp8`` pin
(solve/space.py): FP8 changes the numerics, and its kernels need FP8 tensor cores. When the
device has an FP8 peak and the search left FP8 out, :func:`fp8_gain` runs the same search
(same devices, batch, pins, objective, lossy options) pinned to ``precision=fp8`` and says, in
one line, how the best FP8 plan's step compares with the chosen plan's. Nothing is fitted: it is
the planner, asked again.

For a plan that Megatron-Core will run (``explain --config`` of a Megatron config, ``export --to
megatron``), :func:`te_saving` prices it twice, with Transformer Engine's recipe and with torchao's
tensorwise (docs/cost-model.md, "FP8 recipes"), and says what TE's fused casts save per step.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.display import duration_text
from autoplan.errors import PlanError
from autoplan.report.search_again import search_again
from autoplan.types.graph import Graph
from autoplan.types.local_sgd import is_local_sgd
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile


def fp8_gain(result, *, graph: Graph, profile: Profile) -> str:
    """One line on the best FP8 plan against the chosen one, or '' when FP8 was searched or pinned
    away, or the device has no FP8 peak (module docstring)."""
    from autoplan.solve.api import NoPlanFits

    best = result.best
    searched = best.predicted.search if best is not None and best.predicted else None
    peaks = profile.device.peak_flops
    if searched is None or searched.allow_fp8 or "precision" in searched.fixes or not {"fp8", "bf16"} <= set(peaks):
        return ""
    try:
        fp8 = search_again(best, searched, graph=graph, profile=profile, pin={"precision": "fp8"}, allow_fp8=False)
    except NoPlanFits:
        return "FP8 (not searched: --allow-fp8): no FP8 plan fits on these devices."
    except PlanError:
        return ""
    chosen_s, fp8_s = result.best_cost.step_time_s, fp8.best_cost.step_time_s
    return (
        f"FP8 (not searched: --allow-fp8 to let the planner pick it; it changes the numerics): the best FP8 plan, "
        f"{fp8.best.describe()}, would take {fp8_s * 1e3:.4g} ms per step, {fp8_s / chosen_s:.2f}x the chosen "
        f"plan's {chosen_s * 1e3:.4g} ms."
    )


def te_saving(plan: Plan, *, graph: Graph, profile: Profile) -> str:
    """One sentence on what Transformer Engine's recipe saves over torchao tensorwise for ``plan``
    as Megatron-Core runs it (module docstring); '' unless it is an fp8 plan on a profile with FP8.
    A plan of another runtime is priced as its Megatron export: runtime megatron, TE current scaling."""
    from autoplan.cost import CostModel

    if plan.precision != "fp8" or "fp8" not in profile.device.peak_flops or is_local_sgd(plan):
        return ""  # (Megatron runs no outer sync: types/local_sgd.py)
    if plan.runtime != "megatron":
        plan = replace(plan, runtime="megatron", compile=False, fp8_recipe="te_current")
    model = CostModel(graph, profile)
    te_s = model.estimate(plan).step_time_s
    torchao_s = model.estimate(plan, fp8_recipe="tensorwise").step_time_s
    recipe = {"te_current": "current", "te_delayed": "delayed"}[plan.fp8_recipe_used]
    return (
        f"Transformer Engine's fused casts ({recipe} scaling) save {duration_text(torchao_s - te_s)} per step "
        f"over torchao tensorwise ({duration_text(te_s)} against {duration_text(torchao_s)})."
    )
