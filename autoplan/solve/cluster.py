"""Choose the cluster: sweep device counts and instance profiles, keep the Pareto front of
whole-run time and cost, and recommend what to rent (docs/cost-tutorial.md).

Point (P, N): profile P on N devices, N a power of two in the range (whole nodes above one
node), or each count of an explicit list. The fastest plan on (P, N) is also its cheapest,
since a whole run's wall time T and dollars $ are both increasing in the step time at a fixed N
(cost/run/whole_run.py), so one ``plan_graph`` per point gives its (T, $). The graph is traced once
(it does not depend on the profile) and shared by every point.

Pruning, each skipped point kept as a row with its reason:
  (a) growth: once doubling N did not reduce P's wall time T, larger N are not planned for P
      (past that point more devices only add communication: a rule of thumb, not a bound);
  (b) dominance: bound (1) of solve/search.py over every configuration at (P, N) is a floor
      on the step time, hence on T and $ there (run_limits.step_time_floor_s); when a planned
      point is at least as fast and as cheap as that floor, no plan at (P, N) can enter the
      front, and it is not planned.
Points are visited by N ascending, every profile at each N, so (a) and (b) see the smaller
clusters first.

Front: the planned points no other point dominates (T' <= T and $' <= $, one strictly).
Recommendation, one sentence naming its rule: with a deadline, the cheapest point that meets it
(and the budget, if any); with only a budget, the fastest within it; with neither, the cheapest
whose T is within 1.25x of the fastest T. Ties go to fewer devices. With --spot, T and $ are the
expected spot run's (interruptions are failures).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from autoplan.cost import RunPricer, check_prices, priced_profile
from autoplan.display import hours_text, usd_text
from autoplan.errors import PlanError
from autoplan.profile.io import load_profile
from autoplan.solve import space
from autoplan.solve.api import NoPlanFits, plan_graph
from autoplan.solve.candidates import SearchOptions, SearchResult
from autoplan.solve.pins import parse_fixes
from autoplan.solve.run_limits import step_time_floor_s
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.run import RunEstimate, RunSpec

NEAR_FASTEST = 1.25  # the rule without constraints: the cheapest within this factor of the fastest


@dataclass
class SweepRow:
    """One (profile, devices) point: planned (with its plan and estimate) or why it was not."""

    profile: str
    devices: int
    status: str  # planned | pruned | no fit | skipped
    instance: str = ""
    devices_per_instance: int | None = None
    plan: Plan | None = None
    estimate: RunEstimate | None = None
    pareto: bool = False
    reason: str = ""
    search: SearchResult | None = field(default=None, repr=False)  # a planned point's search: its plan folder
    priced: Profile | None = field(default=None, repr=False)  # the profile it was priced with (prices applied)

    @property
    def wall_h(self) -> float:
        return self.estimate.wall_h

    @property
    def dollars(self) -> float:
        return self.estimate.dollars

    @property
    def label(self) -> str:
        return f"{self.devices} x {self.profile}"

    def rental(self) -> str:
        """'8 x p5.48xlarge' (the instances billed), or '' when the profile names no instance."""
        if not self.instance:
            return ""
        per = self.devices_per_instance or 1
        return f"{-(-self.devices // per)} x {self.instance}"


@dataclass
class SweepResult:
    rows: list[SweepRow]
    recommendation: str
    rule: str
    recommended: SweepRow | None
    plan_calls: int
    grid_size: int
    elapsed_s: float
    spec: RunSpec = field(default_factory=RunSpec)

    @property
    def planned(self) -> list[SweepRow]:
        return [r for r in self.rows if r.status == "planned"]

    @property
    def pareto(self) -> list[SweepRow]:
        """The front, fastest first."""
        return sorted((r for r in self.rows if r.pareto), key=lambda r: (r.wall_h, r.dollars))


class NoClusterMeets(PlanError):
    """No swept cluster meets the deadline or budget; ``result`` keeps every row for sweep.csv."""

    def __init__(self, message: str, result: SweepResult):
        super().__init__(message)
        self.result = result


def device_counts(devices) -> list[int]:
    """Powers of two in a range (``range(8, 1025)``, or the CLI's ``8..1024``); a list or one count as given."""
    if isinstance(devices, str) and ".." in devices:
        lo, _, hi = devices.partition("..")
        devices = range(_count(lo, devices), _count(hi, devices) + 1)
    if isinstance(devices, range):
        counts = [2**k for k in range(devices.stop.bit_length() + 1) if 2**k in devices]
    elif isinstance(devices, (int, str)):
        counts = [_count(devices, devices)]
    else:
        counts = sorted({_count(n, devices) for n in devices})
    if not counts:
        raise PlanError(f"--devices {devices!r} holds no power of two; give a range such as 8..1024.")
    return counts


def _count(value, given) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise PlanError(f"--devices {given!r} is not valid; expected a count, a list or a range such as 8..1024.")
    return count


def sweep_graph(
    graph: Graph,
    *,
    devices,
    profiles: list,
    batch_size: int | None = None,
    run: RunSpec | dict,
    fix: dict | str | None = None,
    solver: str = "highs",
    time_limit_s: float = 10.0,
    prune: bool = True,
    progress=None,
    allow_lossy: bool = False,
    allow_fp8: bool = False,
    runtime: str = "autoplan",
    jobs: int = 1,
) -> SweepResult:
    """Plan every (profile, devices) point worth planning (module docstring); the front and the
    recommendation. Raises NoClusterMeets when no point meets the deadline or budget. ``allow_lossy``
    lets every point's search pick lossy gradient sync (solve/space.py); the pruning floor holds
    for it too (bound (1) of solve/search.py has no gradient-sync term). ``allow_fp8`` lets every
    point's search pick FP8 (solve/space.py); the floor is then taken over FP8 plans too. ``runtime``
    prices every point, and its floor, for that runtime (plan_graph's ``runtime``); ``jobs``: the processes each
    point's search runs on (plan_graph's: the same best plan, so the same front)."""
    start = time.perf_counter()
    run = RunSpec(**run) if isinstance(run, dict) else run
    if not run.has_length:
        raise PlanError("a sweep compares whole runs: pass --tokens N or --steps N.")
    batch = batch_size or graph.batch_size
    loaded = [priced_profile(load_profile(p), run) for p in profiles]
    for profile in loaded:
        if profile.pricing is None:
            raise PlanError(
                f"a sweep compares dollars, but profile '{profile.name}' has no pricing section; pass "
                "--price-per-device-hour X or add pricing.on_demand_per_device_hour (docs/profile-format.md)."
            )
        check_prices(profile, run, objective="cost")
    points = sorted(((n, i) for i, p in enumerate(loaded) for n in device_counts(devices)), key=lambda item: item[0])
    rows, stopped, calls = [], {}, 0
    for index, (n, i) in enumerate(points):
        if progress:
            progress(index, len(points))
        profile = loaded[i]
        row = SweepRow(
            profile=profile.name,
            devices=n,
            status="skipped",
            instance=profile.pricing.instance if profile.pricing else "",
            devices_per_instance=profile.pricing.devices_per_instance if profile.pricing else None,
        )
        rows.append(row)
        pricer = RunPricer(run, profile=profile, params=graph.param_count, batch_size=batch, seq_len=graph.seq_len)
        if not space.fits_nodes(n, profile):
            row.reason = f"{n} devices are not whole nodes of {profile.devices_per_node}"
            continue
        floor = SearchOptions(devices=n, batch_size=batch, fixes=_fixes(fix), allow_fp8=allow_fp8, runtime=runtime)
        if prune and (why := _pruned(graph, profile, pricer, floor, stopped.get(i), rows)):
            row.status, row.reason = "pruned", why
            continue
        calls += 1
        try:
            found = plan_graph(
                graph,
                devices=n,
                profile=profile,
                batch_size=batch,
                fix=fix,
                solver=solver,
                time_limit_s=time_limit_s,
                run=replace(run, deadline_h=None, budget_usd=None),
                allow_lossy=allow_lossy,
                allow_fp8=allow_fp8,
                runtime=runtime,
                jobs=jobs,
            )
        except NoPlanFits as exc:
            row.status, row.reason = "no fit", str(exc)
            continue
        except PlanError as exc:  # no legal configuration at this count
            row.reason = str(exc)
            continue
        row.status, row.plan, row.estimate = "planned", found.best, found.best.predicted.run
        row.search, row.priced = found, profile
        previous = [r for r in rows[:-1] if r.profile == row.profile and r.status == "planned"]
        if previous and row.wall_h >= previous[-1].wall_h:
            stopped[i] = previous[-1].devices
    if progress:
        progress(len(points), len(points))
    _mark_front(rows)
    result = SweepResult(rows, "", "", None, calls, len(points), time.perf_counter() - start, run)
    recommend(result)
    return result


def _fixes(fix: dict | str | list | None) -> dict:
    return parse_fixes(fix) if isinstance(fix, (str, list)) or fix is None else dict(fix)


def _pruned(graph, profile, pricer, options: SearchOptions, stopped_at, rows) -> str:
    """Why (profile, ``options.devices``) need not be planned (module docstring, rules a and b), or ''."""
    if stopped_at is not None:
        return f"pruned (growth): doubling past {stopped_at} devices no longer reduced the run's time"
    try:
        floor_s = step_time_floor_s(graph, profile, options)
    except PlanError:
        return ""
    if floor_s is None:
        return ""
    floor = pricer.estimate(step_time_s=floor_s, devices=options.devices)
    for other in rows:
        if other.status == "planned" and other.wall_h <= floor.wall_h and other.dollars <= floor.dollars:
            return (
                f"pruned (dominated): {other.label} ({hours_text(other.wall_h)}, {usd_text(other.dollars)}) "
                f"beats this point's floor ({hours_text(floor.wall_h)}, {usd_text(floor.dollars)})"
            )
    return ""


def _mark_front(rows: list[SweepRow]) -> None:
    planned = [r for r in rows if r.status == "planned"]
    for row in planned:
        row.pareto = not any(
            o.wall_h <= row.wall_h and o.dollars <= row.dollars and (o.wall_h < row.wall_h or o.dollars < row.dollars)
            for o in planned
        )


def recommend(result: SweepResult) -> None:
    """Fill ``recommended``, ``rule`` and the one-sentence ``recommendation`` (module docstring);
    raise NoClusterMeets naming what to change when nothing meets the constraints."""
    spec, planned = result.spec, result.planned
    if not planned:
        reasons = "; ".join(dict.fromkeys(r.reason for r in result.rows if r.reason))
        raise NoClusterMeets(f"no swept cluster has a plan that fits: {reasons}", result)
    fastest = min(planned, key=lambda r: (r.wall_h, r.devices))
    cheapest = min(planned, key=lambda r: (r.dollars, r.devices))
    deadline, budget = spec.deadline_h, spec.budget_usd
    meets = [
        r for r in planned if (deadline is None or r.wall_h <= deadline) and (budget is None or r.dollars <= budget)
    ]
    if deadline is not None:
        rule = f"the cheapest that meets the {hours_text(deadline)} deadline"
        rule += f" within the {usd_text(budget)} budget" if budget is not None else ""
        pick = min(meets, key=lambda r: (r.dollars, r.devices)) if meets else None
    elif budget is not None:
        rule = f"the fastest within the {usd_text(budget)} budget"
        pick = min(meets, key=lambda r: (r.wall_h, r.devices)) if meets else None
    else:
        rule = f"the cheapest within {NEAR_FASTEST:g}x of the fastest"
        near = [r for r in planned if r.wall_h <= NEAR_FASTEST * fastest.wall_h]
        pick = min(near, key=lambda r: (r.dollars, r.devices))
    result.rule = rule
    if pick is None:
        raise NoClusterMeets(_unmet(result, fastest), result)
    result.recommended = pick
    rental = f" ({pick.rental()})" if pick.rental() else ""
    other, name = (cheapest, "the cheapest") if pick is not cheapest else (fastest, "the fastest")
    contrast = (
        f"; {name}, {other.label}, takes {hours_text(other.wall_h)} for {usd_text(other.dollars)}"
        if other is not pick
        else ", the fastest and the cheapest"
    )
    spot = " on spot" if spec.spot else ""
    result.recommendation = (
        f"Rent {pick.label}{rental}{spot}: {hours_text(pick.wall_h)}, {usd_text(pick.dollars)}, {rule}{contrast}."
    )


def _unmet(result: SweepResult, fastest: SweepRow) -> str:
    spec, planned = result.spec, result.planned
    if spec.deadline_h is not None and fastest.wall_h > spec.deadline_h:
        largest = max(r.devices for r in result.rows)
        more = f"sweep more than {largest} devices or " if fastest.devices == largest else ""
        return (
            f"no swept cluster meets the {hours_text(spec.deadline_h)} deadline: the fastest, {fastest.label}, "
            f"takes {hours_text(fastest.wall_h)}; {more}relax --deadline to {hours_text(fastest.wall_h)}."
        )
    meeting = [r for r in planned if spec.deadline_h is None or r.wall_h <= spec.deadline_h]
    cheapest = min(meeting, key=lambda r: (r.dollars, r.devices))
    which = "the cheapest that meets the deadline" if spec.deadline_h is not None else "the cheapest"
    return (
        f"no swept cluster fits the {usd_text(spec.budget_usd)} budget: {which}, {cheapest.label}, costs "
        f"{usd_text(cheapest.dollars)}; raise --budget to {usd_text(cheapest.dollars)}."
    )


def sweep(
    model,
    example_inputs=None,
    *,
    devices,
    profiles: list,
    batch_size: int | None = None,
    tokens: float | None = None,
    steps: int | None = None,
    spot: bool = False,
    deadline_h: float | None = None,
    budget_usd: float | None = None,
    price_per_device_hour: float | None = None,
    **kwargs,
) -> SweepResult:
    """Sweep clusters for a model file path, a traced Graph, or a module with its example inputs
    (module docstring); ``devices`` a (lo, hi) pair, a range or a list of counts."""
    spec = RunSpec(
        tokens=tokens,
        steps=steps,
        spot=spot,
        deadline_h=deadline_h,
        budget_usd=budget_usd,
        price_per_device_hour=price_per_device_hour,
    )
    if isinstance(model, Graph):
        graph = model
    elif isinstance(model, str):
        from autoplan.trace import trace_model_file

        graph = trace_model_file(model, batch_size)
    else:
        from autoplan.trace import trace

        graph = trace(model, example_inputs, model_name=type(model).__name__)
    return sweep_graph(graph, devices=devices, profiles=profiles, batch_size=batch_size, run=spec, **kwargs)
