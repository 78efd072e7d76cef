"""Plans fit in memory but none meets the deadline or the budget: one sentence naming what to change.

Deadline: the fastest plan's expected wall time, and the smallest device count among 2N, 4N, ...
64N (whole nodes) whose fastest plan meets it, found by the same search with objective ``time``.
Before each search, bound (1) of solve/search.py gives a floor on the step time, hence on the
whole run's wall time (cost/run/whole_run.py: increasing in the step time at a fixed N); a count whose
floor misses the deadline is skipped without an ILP.

Budget: the cheapest plan that meets the deadline (the search again without the budget: at a
fixed N the fastest, with ``--objective cost`` the cheapest over fewer devices too) costs the
budget needed.
"""

from __future__ import annotations

from dataclasses import replace

from autoplan.cost import RunPricer
from autoplan.display import hours_text, usd_text
from autoplan.errors import PlanError
from autoplan.solve import space
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile
from autoplan.types.run import RunEstimate

GROWTH = 64  # the largest cluster tried, as a multiple of the devices asked for


def explain_unmet(graph: Graph, profile: Profile, options: SearchOptions) -> str:
    """One sentence: which constraint no plan meets, by how much, and what would meet it (plans fit
    when the constraints are dropped)."""
    run = options.run
    pricer = RunPricer(
        run, profile=profile, params=graph.param_count, batch_size=options.batch_size, seq_len=graph.seq_len
    )
    on = f"on {options.devices} devices"
    if run.deadline_h is not None:
        free = replace(run, deadline_h=None, budget_usd=None)
        fastest, quickest = _best(graph, profile, replace(options, objective="time", run=free), pricer)
        if quickest.wall_h > run.deadline_h:
            head = (
                f"no plan {on} finishes within the {hours_text(run.deadline_h)} deadline: "
                f"the fastest ({fastest.describe()}) takes {hours_text(quickest.wall_h)}"
            )
            needed = smallest_devices_for_deadline(graph, profile, options)
            if needed is not None:
                return f"{head}; the smallest cluster that meets it is {needed} devices: plan with --devices {needed}."
            return (
                f"{head}, and no cluster up to {options.devices * GROWTH} devices meets it; "
                f"relax --deadline to {hours_text(quickest.wall_h)} or more."
            )
    cheapest, estimate = _best(graph, profile, replace(options, run=replace(run, budget_usd=None)), pricer)
    which = "the cheapest that meets the deadline" if run.deadline_h is not None else "the cheapest"
    fewer = " or let --objective cost try fewer devices" if options.objective == "time" else ""
    return (
        f"no plan {on} fits the {usd_text(run.budget_usd)} budget: {which} ({cheapest.describe()}) "
        f"costs {usd_text(estimate.dollars)}; raise --budget to {usd_text(estimate.dollars)}{fewer}."
    )


def _best(graph: Graph, profile: Profile, options: SearchOptions, pricer: RunPricer) -> tuple[Plan, RunEstimate]:
    """The best plan of a search (its objective: the fastest, or the cheapest) and its whole run."""
    found = Search(graph, profile, replace(options, progress=None, keep=1)).run()
    return found.best, pricer.estimate(step_time_s=found.best_cost.step_time_s, devices=found.best.devices)


def step_time_floor_s(graph: Graph, profile: Profile, options: SearchOptions) -> float | None:
    """Bound (1) of solve/search.py over every configuration on ``options.devices`` devices: no
    plan there steps faster. None when no configuration is legal there."""
    probe = Search(graph, profile, replace(options, objective="time", run=None, progress=None))
    groups = probe.groups()
    return groups[0][0] if groups else None


def smallest_devices_for_deadline(graph: Graph, profile: Profile, options: SearchOptions) -> int | None:
    """The smallest of 2N, 4N, ... 64N devices whose fastest plan meets the deadline, or None."""
    run = replace(options.run, budget_usd=None)
    pricer = RunPricer(
        run, profile=profile, params=graph.param_count, batch_size=options.batch_size, seq_len=graph.seq_len
    )
    count = options.devices
    while count < options.devices * GROWTH:
        count *= 2
        if not space.fits_nodes(count, profile):
            continue
        trial = replace(options, devices=count, objective="time", run=run, progress=None, keep=1)
        try:
            floor_s = step_time_floor_s(graph, profile, trial)
            if floor_s is None or pricer.estimate(step_time_s=floor_s, devices=count).wall_h > run.deadline_h:
                continue
            if Search(graph, profile, trial).run().best is not None:
                return count
        except PlanError:  # no legal configuration at this count (the batch does not divide, say)
            continue
    return None
