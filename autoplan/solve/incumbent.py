"""An early incumbent: before its bounded loop the search prices the members of least bound (2) of its first groups
(by bound (1)), so the pruning threshold starts near the best instead of at the first group's best (solve/search.py;
docs/ilp.md, "An early incumbent").

The probes are members found as the loop finds them (Search._run_group with every price deferred: ``probing``),
priced by the same Search._evaluate, retries and all, in order of bound (2) until a few fit. The loop prunes only
by sound bounds against the objectives of plans it priced, whichever order it meets them in, so its best plan and
price are those of the plain loop (tests/unit/solve/test_incumbent.py). A probe's rows are held and put among the
candidates where the loop reaches the same plan, so a group's retries read the rows they always read; the rows
of a probe the loop prunes come last. GROUPS, PROBES and TRIES set the search's own effort, not a model of the
hardware.
"""

from __future__ import annotations

from typing import Any

from autoplan.solve.candidates import Candidate
from autoplan.types.plan import Plan

GROUPS = 8  # the first groups by bound (1) whose members are probed
PROBES = 4  # members that fit, priced in order of bound (2) ...
TRIES = 64  # ... of at most this many (most of the least bounds do not fit: their memory alone is priced)


class Probes:
    """The priced probes' rows, by plan, until the loop reaches each plan."""

    def __init__(self) -> None:
        self._rows: dict[str, list[tuple[Plan, list[Candidate]]]] = {}

    def take(self, plan: Plan) -> list[Candidate] | None:
        """The rows of ``plan`` if it was probed (once), else None."""
        held = self._rows.get(plan.describe()) if self._rows else None
        for i, (probed, rows) in enumerate(held or []):
            if probed == plan:
                del held[i]
                return rows
        return None

    def leftovers(self) -> list[Candidate]:
        """The rows of the probes the loop never reached (it pruned them): priced plans all the same."""
        return [row for held in self._rows.values() for _, rows in held for row in rows]

    def hold(self, plan: Plan, rows: list[Candidate]) -> None:
        self._rows.setdefault(plan.describe(), []).append((plan, rows))


def probe(search: Any, groups: list[tuple[float, Any]]) -> Probes:
    """Price the members of the first :data:`GROUPS` ``groups`` in order of bound (2) until :data:`PROBES` of them
    (or their retries) fit or :data:`TRIES` were priced; their rows held."""
    probes, found = Probes(), []
    if search.pricer is not None and search.pricer.spec.constrained:
        return probes  # the loop may skip a group by its run's deadline or budget: probe nothing
    kept, search.probing = search.candidates, found
    try:
        for bound, group in groups[:GROUPS]:
            search.candidates = []  # the pruned rows of the probing pass are the loop's to write
            search._run_group(group, bound)
    finally:
        search.probing = None
    fitting = 0
    for sub, plan, ilp_status in sorted(found, key=lambda item: item[0])[:TRIES]:
        search.candidates = []
        search._evaluate(plan, sub, ilp_status=ilp_status)
        probes.hold(plan, search.candidates)
        if (fitting := fitting + any(c.feasible for c in search.candidates)) >= PROBES:
            break
    search.candidates = kept
    return probes
