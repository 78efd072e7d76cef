"""``autoplan.plan(model, example_inputs, devices=..., profile=..., batch_size=...) -> Plan``.

Trace (autoplan.trace) -> search (solve/search.py) -> the best Plan, whose ``predicted`` holds
the cost model's prediction (docs/plan-format.md), with the checkpoint interval and expected
goodput when the profile has storage and reliability sections (cost/run/reliability.py), and with
``run`` (a :class:`RunSpec`: the run's tokens or steps, prices, spot, deadline, budget) the
whole run's wall time, device-hours and dollars (cost/run/whole_run.py). When
nothing fits, :class:`NoPlanFits` says in one sentence what would: more devices (the smallest
count that fits, found by pricing the most memory-frugal configurations of 2x, 4x, ... the
devices), or the changes (recomputation, ZeRO, micro-batch, batch) the user pinned away; when
plans fit but none meets the deadline or budget, it names the device count that meets the
deadline or the budget needed (solve/run_limits.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoplan.cost import CostModel, pipeline_blocks, priced_profile, reliability_fields, run_pricer, usable_bytes
from autoplan.errors import PlanError
from autoplan.profile.io import load_profile, profile_file
from autoplan.solve import sequence_parallel, space, tp_runnable
from autoplan.solve.built_in_precision import built_in_precision
from autoplan.solve.candidates import SearchOptions, SearchResult
from autoplan.solve.context_parallel import cp_sequence, variant_options
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import search
from autoplan.types.context_parallel import masked_attention
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.prediction import Prediction, SearchSummary
from autoplan.types.profile import Profile
from autoplan.types.run import RunSpec
from autoplan.types.runtime import runtime_named

FRUGAL_PINS = ("recompute", "zero", "mbs", "sp")


class NoPlanFits(PlanError):
    """No configuration fits in device memory; ``result`` keeps every candidate for plans.csv."""

    def __init__(self, message: str, result: SearchResult | None = None):
        super().__init__(message)
        self.result = result


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
    jobs: int = 1,
    progress=None,
    top_k: int = 1,
    run: RunSpec | dict | None = None,
    allow_lossy: bool = False,
    allow_fp8: bool = False,
    runtime: str = "autoplan",
) -> SearchResult:
    """Search plans for a traced graph; raises NoPlanFits when nothing fits. The best ``top_k``
    plans are ranked exactly (pruning only skips what cannot enter them). A profile given as a
    file is recorded in the plan by its path, so that ``run --audit`` and ``calibrate`` can load
    it again (a shipped profile by its name). ``run`` (a RunSpec or its fields as a dict) prices the
    whole run into ``predicted.run`` and applies its deadline and budget. ``allow_lossy`` also
    searches (and allows pins of) gradient reduction below fp32 and PowerSGD (Plan.lossy);
    ``allow_fp8`` also searches FP8 linears (a ``precision=fp8`` pin searches them without it).
    ``runtime`` prices every plan for that runtime (types/runtime.py: ``autoplan``'s executor, or a
    framework to export to); the refusals of what autoplan's executor cannot run still apply. ``jobs``: the
    processes to search on (solve/shares.py; 0: one per core, at most 4): the same best plan and exact top k."""
    source = profile_file(profile)
    profile = load_profile(profile)
    run = RunSpec(**run) if isinstance(run, dict) else run
    if run is not None:
        profile = priced_profile(profile, run)
    fixes = parse_fixes(fix) if isinstance(fix, (str, list)) or fix is None else dict(fix)
    options = SearchOptions(
        devices=devices,
        batch_size=batch_size or graph.batch_size,
        fixes=fixes,
        objective=objective,
        solver=solver,
        time_limit_s=time_limit_s,
        jobs=jobs,
        progress=progress,
        keep=max(1, top_k),
        run=run,
        allow_lossy=allow_lossy,
        allow_fp8=allow_fp8,
        runtime=runtime_named(runtime).name,  # an unknown name is one sentence before the search
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
    result.best.model_sha256, result.best.graph_signature = graph.model_sha256, graph.signature  # what it is for
    result.best.inputs = list(graph.inputs)  # so parallelize can build a micro-batch itself (types/inputs.py)
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
        allow_fp8=allow_fp8,
        search_processes=result.processes,
    )  # for autoplan explain
    checkpoints = reliability_fields(
        params=graph.param_count, devices=devices, profile=profile, step_time_s=result.best_cost.step_time_s
    )  # the same for every plan of this cluster, so it ranks nothing (cost/run/reliability.py)
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
    """Trace ``model`` on ``example_inputs`` and return the fastest (or cheapest) plan that fits.
    ``kwargs`` go to :func:`plan_graph` (``allow_fp8=True`` searches FP8 too, ``allow_lossy=True``
    lossy gradient sync)."""
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
    if closest is not None and closest.cost.peak_memory_bytes <= usable_bytes(profile.device.memory_bytes):
        head = f"no plan fits in host memory: the most frugal one evaluated ({closest.plan.describe()}) fits the "
        head += (
            f"device, but {closest.cost.reason}"  # the host refused it (cost/memory/offload.py, activation_offload.py)
        )
    elif closest is not None:
        head += (
            f": the most frugal one evaluated ({closest.plan.describe()}) "
            f"needs {closest.cost.peak_memory_bytes / 2**30:.1f} GiB per device, more than the "
            f"{usable_bytes(profile.device.memory_bytes) / 2**30:.1f} GiB usable of "
            f"{profile.device.memory_bytes / 2**30:.0f} GiB (less allocator headroom)"
        )
    pinned = [k for k in FRUGAL_PINS if k in options.fixes]
    kept = {k: v for k, v in options.fixes.items() if k not in pinned}
    fit = _frugal_fit(graph, profile, options.devices, options.batch_size, kept, options) if pinned else None
    if fit is not None:
        return f"{head}; unpin {', '.join(pinned)}: --fix {_pins(fit, kept)} fits on {options.devices} devices."
    needed = smallest_fitting_devices(graph, profile, options)
    if needed is not None:
        return f"{head}; it would fit on {needed.devices} devices (for example --fix {_pins(needed, {})})."
    return (
        f"{head}, even on {options.devices * 64} devices; use a smaller model or batch, or a device with more memory."
    )


def smallest_fitting_devices(graph: Graph, profile: Profile, options: SearchOptions) -> Plan | None:
    """The most frugal plan that fits on the fewest of 2x, 4x, ... 64x the devices, or None."""
    count = options.devices
    for _ in range(6):
        count *= 2
        if count > profile.devices_per_node and (profile.inter_node is None or count % profile.devices_per_node):
            continue
        if (fit := _frugal_fit(graph, profile, count, options.batch_size, {}, options)) is not None:
            return fit
    return None


def _pins(plan: Plan, kept: dict) -> str:
    """``--fix`` pins that give ``plan``: the ones the user keeps, then the plan's own degrees and
    memory choices (each such plan was priced by CostModel and fits)."""
    own = {
        "tp": plan.tp,
        "pp": plan.pp,
        **({"cp": plan.cp, "cp_variant": plan.cp_variant} if plan.cp > 1 else {}),
        "zero": plan.zero_stage,
        "recompute": plan.recompute,
        "mbs": plan.micro_batch_size,
        "sp": plan.sequence_parallel,
        "precision": plan.precision,
    }
    pins = {**kept, **{k: v for k, v in own.items() if k not in kept}}
    return ",".join(f"{k}={_pin_text(v)}" for k, v in pins.items())


def _pin_text(value) -> str:
    """A pin's value as --fix spells it: on/off, counts joined by '/', else the value."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "/".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def _frugal_fit(
    graph: Graph, profile: Profile, devices: int, batch: int, fixes: dict, options: SearchOptions
) -> Plan | None:
    """The first of the most memory-frugal configurations of ``devices`` (full recomputation, the
    highest ZeRO stage dp allows, micro-batch 1, sequence parallelism, the narrowest precision)
    that fits under the search's runtime, or None. Degrees whose dp a ZeRO pin rules out are
    skipped, as the search skips them."""
    model = CostModel(graph, profile)
    allow_fp8 = options.allow_fp8
    frugal = {"recompute": "full", "mbs": 1, **fixes}
    seq_lens = sequence_parallel.sequence_lengths(graph)
    for deg in space.degree_options(
        devices=devices,
        per_node=profile.devices_per_node,
        layers=pipeline_blocks(graph),
        batch=batch,
        fixes=frugal,
        max_tp=tp_runnable.max_tp(graph, fixes),
        cp_seq_len=cp_sequence(graph, profile, fixes),
        cp_beside_pp=not masked_attention(graph),
        whole_batch=bool(graph.batch_coupled),
    ):
        moe = any(layer.interface == "grouped" for layer in graph.moe_layers)
        local = tuple(n // deg.cp for n in seq_lens)
        for sp in sequence_parallel.sp_options(tp=deg.tp, seq_lens=local, fixes=frugal, pp=deg.pp, moe=moe)[-1:]:
            whole = bool(graph.batch_coupled)
            for mbs in space.micro_batch_options(batch=batch, dp=deg.dp, fixes=frugal, whole=whole)[:1]:
                zeros = space.zero_options(dp=deg.dp_cp, fixes=frugal)
                if not zeros:
                    continue
                zero = max(zeros)
                precision = space.precision_options(
                    profile, fixes=frugal, allow_fp8=allow_fp8, runtime=options.runtime,
                    built_in=built_in_precision(graph),
                )[-1]  # fmt: skip
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
                    cp=deg.cp,
                    cp_variant=variant_options(profile, cp=deg.cp, fixes=frugal, masked=masked_attention(graph))[0],
                    runtime=options.runtime,
                )
                if model.estimate(candidate).feasible:
                    return candidate
    return None
