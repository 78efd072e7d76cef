"""Solving a PuLP model: HiGHS (through highspy) by default, PuLP's bundled CBC as fallback.

PuLP's ``LpProblem.status`` reads "Optimal" even when the solver stopped at its time limit
with a merely feasible incumbent; the honest answer is ``LpProblem.sol_status``
(``LpSolutionOptimal`` vs ``LpSolutionIntegerFeasible``). :func:`solve_model` reports that,
and the relative MIP gap HiGHS reports (``mip_gap`` in its info; CBC's is not exposed by
PuLP, so it is None there unless the solve was optimal, where it is 0).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.errors import PlanError

if TYPE_CHECKING:  # PuLP is imported where it runs (CBC, a missing highspy, the partition ILP): cli/startup.py
    import pulp

SOLVERS = ("highs", "cbc")
#: HiGHS options beyond the time limit and threads. Its feasibility-jump heuristic (Luteberget & Sartor,
#: "Feasibility Jump", Math. Prog. Comp. 2023; on by default since HiGHS 1.9) spends ~7 ms of CPU before the root LP
#: of every MIP, however small: 24 of the 4-layer GPT's intra-op ILPs (15 columns, 14 rows) took 7-8 ms each with
#: it and 0.6-0.9 ms without, the same optimum at one node. An older HiGHS ignores the unknown option.
HIGHS_OPTIONS = {"mip_heuristic_run_feasibility_jump": False}


@dataclass(frozen=True)
class SolveStatus:
    status: str  # 'optimal' | 'time_limit' | 'infeasible'
    solver: str  # 'highs' | 'cbc'
    gap: float | None  # relative MIP gap of the returned solution (0 when optimal)
    objective: float | None
    solve_time_s: float

    @property
    def has_solution(self) -> bool:
        return self.status in ("optimal", "time_limit")


def variable(
    model: pulp.LpProblem, name: str, *, low: float | None = None, up: float | None = None, cat: str = "Continuous"
) -> pulp.LpVariable:
    """A variable attached to ``model`` (PuLP >= 3.3's add_variable; older PuLP: LpVariable)."""
    if hasattr(model, "add_variable"):
        return model.add_variable(name, low, up, cat=cat)
    import pulp

    return pulp.LpVariable(name, lowBound=low, upBound=up, cat=cat)


def make_solver(name: str, *, time_limit_s: float):
    """A PuLP solver object; 'highs' falls back to CBC when highspy is not importable."""
    if name not in SOLVERS:
        raise PlanError(f"solver '{name}' is unknown; expected one of {', '.join(SOLVERS)}.")
    import pulp

    if name == "highs":
        solver = pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=1, **HIGHS_OPTIONS)
        if solver.available():
            return "highs", solver
    with warnings.catch_warnings():  # PuLP 3.3 deprecates its bundled CBC in favour of COIN_CMD
        warnings.simplefilter("ignore", DeprecationWarning)
        return "cbc", pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s)


def solve_model(problem: pulp.LpProblem, *, solver: str = "highs", time_limit_s: float = 10.0) -> SolveStatus:
    """Solve ``problem`` in place and say honestly how it ended (see the module docstring)."""
    import pulp

    used, backend = make_solver(solver, time_limit_s=time_limit_s)
    start = time.perf_counter()
    with _quiet_stdout():
        problem.solve(backend)
    elapsed = time.perf_counter() - start
    sol = problem.sol_status
    if sol == pulp.LpSolutionOptimal:
        status, gap = "optimal", 0.0
    elif sol == pulp.LpSolutionIntegerFeasible:
        status, gap = "time_limit", _highs_gap(problem)
    else:
        status, gap = "infeasible", None
    objective = pulp.value(problem.objective) if status != "infeasible" else None
    return SolveStatus(status=status, solver=used, gap=gap, objective=objective, solve_time_s=elapsed)


def _highs_gap(problem: pulp.LpProblem) -> float | None:
    model = getattr(problem, "solverModel", None)
    if model is None:
        return None
    try:
        return float(model.getInfo().mip_gap)
    except AttributeError:
        return None


@contextlib.contextmanager
def _quiet_stdout():
    """Silence the banner highspy prints on file descriptor 1 (it would spoil --json output)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
