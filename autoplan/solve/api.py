"""``autoplan.plan(model, example_inputs, devices=..., profile=..., batch_size=...) -> Plan``.

Trace (autoplan.trace) -> search (solve/search.py) -> the best Plan, whose ``predicted`` holds
the cost model's prediction (docs/plan-format.md), with the checkpoint interval and expected
goodput when the profile has storage and reliability sections (cost/reliability.py), and with
``run`` (a :class:`RunSpec`: the run's tokens or steps, prices, spot, deadline, budget) the
whole run's wall time, device-hours and dollars (cost/whole_run.py). When
nothing fits, :class:`NoPlanFits` says in one sentence what would: more devices (the smallest
count that fits, found by pricing the most memory-frugal configurations of 2x, 4x, ... the
devices), or the changes (recomputation, ZeRO, micro-batch, batch) the user pinned away; when
plans fit but none meets the deadline or budget, it names the device count that meets the
deadline or the budget needed (solve/run_limits.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from autoplan.cost import reliability
from autoplan.cost.model import CostModel
from autoplan.cost.whole_run import priced_profile, run_pricer
from autoplan.errors import PlanError
from autoplan.solve import space, tp_runnable
from autoplan.solve.candidates import SearchOptions, SearchResult
from autoplan.solve.search import search
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.prediction import Prediction, SearchSummary
from autoplan.types.profile import Profile
from autoplan.types.run import RunSpec

FRUGAL_PINS = ("recompute", "zero", "mbs", "sp")


class NoPlanFits(PlanError):
    """No configuration fits in device memory; ``result`` keeps every candidate for plans.csv."""

    def __init__(self, message: str, result: SearchResult | None = None):
        super().__init__(message)
        self.result = result


def profile_file(profile: Profile | str) -> str | None:
    """The absolute path of a profile given as a file, else None (a name or a Profile)."""
    if isinstance(profile, str) and Path(profile).suffix in (".yaml", ".yml", ".json") and Path(profile).is_file():
        return str(Path(profile).resolve())
    return None


def resolve_profile(profile: Profile | str) -> Profile:
    if isinstance(profile, Profile):
        return profile
    from autoplan.profile import load_profile

    return load_profile(profile)


def plan_graph(
    graph: Graph,
    *,
    devices: int,
    profile: Profile | str,
    batch_size: int | None = None,
    fix: dict | str | None = None,
    objective: str = "time",
    solver: str = "highs",
    time_limit_s: float = 10.0,
    progress=None,
    top_k: int = 1,
    run: RunSpec | dict | None = None,
    allow_lossy: bool = False,
) -> SearchResult:
    """Search plans for a traced graph; raises NoPlanFits when nothing fits. The best ``top_k``
    plans are ranked exactly (pruning only skips what cannot enter them). A profile given as a
    file is recorded in the plan by its path, so that ``run --audit`` and ``calibrate`` can load
    it again (a shipped profile by its name). ``run`` (a RunSpec or its fields as a dict) prices the
    whole run into ``predicted.run`` and applies its deadline and budget. ``allow_lossy`` also
    searches (and allows pins of) gradient reduction below fp32 and PowerSGD (Plan.lossy)."""
    source = profile_file(profile)
    profile = resolve_profile(profile)
    run = RunSpec(**run) if isinstance(run, dict) else run
    if run is not None:
        profile = priced_profile(profile, run)
    fixes = space.parse_fixes(fix) if isinstance(fix, (str, list)) or fix is None else dict(fix)
    options = SearchOptions(
        devices=devices,
        batch_size=batch_size or graph.batch_size,
        fixes=fixes,
        objective=objective,
        solver=solver,
        time_limit_s=time_limit_s,
        progress=progress,
        keep=max(1, top_k),
        run=run,
        allow_lossy=allow_lossy,
    )
    result = search(graph, profile, options)
    if result.best is None and run is not None and run.constrained:
        free = search(graph, profile, replace(options, run=replace(run, deadline_h=None, budget_usd=None)))
        if free.best is not None:  # plans fit, but none meets the deadline or budget
            from autoplan.solve.run_limits import explain_unmet

            raise NoPlanFits(explain_unmet(graph, profile, options), result)
        result = free
    if result.best is None:
        raise NoPlanFits(explain_no_fit(graph, profile, options, result), result)
    if source is not None:
        result.best.profile = source
    summary = SearchSummary(
        candidates_evaluated=result.evaluated,
        candidates_pruned=result.pruned,
        search_time_s=result.elapsed_s,
        ilp_solves=result.ilp_solves,
        ilp_status=result.ilp_status,
        ilp_gap=result.ilp_gap,
        batch_size=options.batch_size,
        fixes=dict(fixes),
        objective=objective,
        allow_lossy=allow_lossy,
    )  # for autoplan explain
    checkpoints = reliability.prediction_fields(
        params=graph.param_count, devices=devices, profile=profile, step_time_s=result.best_cost.step_time_s
    )  # the same for every plan of this cluster, so it ranks nothing (cost/reliability.py)
    pricer = run_pricer(run, graph=graph, profile=profile, batch=options.batch_size, objective=objective)
    estimate = (
        pricer.estimate(step_time_s=result.best_cost.step_time_s, devices=result.best.devices) if pricer else None
    )
    result.best.predicted = Prediction.from_cost(result.best_cost, summary, run=estimate, **checkpoints)
    return result


def plan(
    model: Any,
    example_inputs: Any,
    *,
    devices: int,
    profile: Profile | str,
    batch_size: int | None = None,
    fix: dict | str | None = None,
    objective: str = "time",
    loss_fn=None,
    target=None,
    **kwargs: Any,
) -> Plan:
    """Trace ``model`` on ``example_inputs`` and return the fastest (or cheapest) plan that fits."""
    from autoplan.trace import trace

    graph = trace(model, example_inputs, loss_fn=loss_fn, target=target, model_name=type(model).__name__)
    return plan_graph(
        graph, devices=devices, profile=profile, batch_size=batch_size, fix=fix, objective=objective, **kwargs
    ).best


def explain_no_fit(graph: Graph, profile: Profile, options: SearchOptions, result: SearchResult) -> str:
    """One sentence: how far the closest plan is from fitting, and what would fit."""
    evaluated = [c for c in result.candidates if c.cost is not None]
    closest = min(evaluated, key=lambda c: c.cost.peak_memory_bytes) if evaluated else None
    head = "no plan fits in device memory"
    if closest is not None:
        head += (
            f": the most frugal one evaluated ({closest.plan.describe()}) "
            f"needs {closest.cost.peak_memory_bytes / 2**30:.1f} GiB"
            f" per device of {profile.device.memory_bytes / 2**30:.0f} GiB"
        )
    pinned = [k for k in FRUGAL_PINS if k in options.fixes]
    if pinned and _fits(
        graph, profile, options.devices, options.batch_size, {k: v for k, v in options.fixes.items() if k not in pinned}
    ):
        return (
            f"{head}; unpin {', '.join(pinned)} (e.g. recompute=full, zero=3, mbs=1) "
            f"and it fits on {options.devices} devices."
        )
    needed = smallest_fitting_devices(graph, profile, options)
    if needed is not None:
        return (
            f"{head}; it would fit on {needed} devices "
            "(the most frugal configuration: full recomputation, ZeRO-3, micro-batch 1)."
        )
    return (
        f"{head}, even on {options.devices * 64} devices; use a smaller model or batch, or a device with more memory."
    )


def smallest_fitting_devices(graph: Graph, profile: Profile, options: SearchOptions) -> int | None:
    count = options.devices
    for _ in range(6):
        count *= 2
        if count > profile.devices_per_node and (profile.inter_node is None or count % profile.devices_per_node):
            continue
        if _fits(graph, profile, count, options.batch_size, {}):
            return count
    return None


def _fits(graph: Graph, profile: Profile, devices: int, batch: int, fixes: dict) -> bool:
    """Whether the most memory-frugal configurations of ``devices`` fit (full recompute, ZeRO-3, mbs 1)."""
    model = CostModel(graph, profile)
    frugal = {"recompute": "full", "mbs": 1, **fixes}
    for deg in space.degree_options(
        devices=devices,
        per_node=profile.devices_per_node,
        layers=len(graph.layers),
        batch=batch,
        fixes=frugal,
        max_tp=tp_runnable.max_tp(graph, fixes),
    ):
        for sp in space.sp_options(tp=deg.tp, seq_len=graph.seq_len, fixes=frugal)[-1:]:
            for mbs in space.micro_batch_options(batch=batch, dp=deg.dp, fixes=frugal)[:1]:
                zero = max(space.zero_options(dp=deg.dp, fixes=frugal) or [0])
                precision = space.precision_options(profile, fixes=frugal)[-1]
                candidate = Plan(
                    devices=devices,
                    dp=deg.dp,
                    tp=deg.tp,
                    pp=deg.pp,
                    micro_batch_size=mbs,
                    num_microbatches=batch // (deg.dp * mbs),
                    zero_stage=zero,
                    recompute=frugal["recompute"],
                    sequence_parallel=sp,
                    precision=precision,
                )
                if model.estimate(candidate).feasible:
                    return True
    return False
