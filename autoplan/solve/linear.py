"""A small mixed-integer model handed to HiGHS directly, as PuLP would hand it, or to PuLP for CBC.

The intra-op ILPs (solve/intra_op.py) are small (tens of columns) and many (300 on DeepSeek-V3); building each
as PuLP expressions and letting PuLP copy them into HiGHS cost about as much as HiGHS's solve. A
:class:`LinearModel` keeps rows as coefficient lists and hands HiGHS the model PuLP's HiGHS API
(``pulp/apis/highs_api.py`` ``buildSolverModel``) builds from the same rows, so the same solve runs:

- columns ordered by name (``LpProblem.variables`` sorts them), those no row or objective term names left out,
  and PuLP's ``__dummy`` column (bounds 0, cost 1) when no objective term names a column (``fixObjective``);
- a column's cost its objective coefficient, a row's coefficients merged per column in the order first named,
  zeros dropped, binaries marked integer;
- row bounds as PuLP computes them: ``-(constant - rhs)`` (``LpConstraint``).

CBC (or a missing highspy) gets the same rows as a PuLP model (:func:`to_pulp`), solved by backend.solve_model.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from autoplan.solve import backend
from autoplan.solve.backend import SolveStatus, _quiet_stdout, solve_model, variable

if TYPE_CHECKING:  # PuLP is imported where it runs (backend.py)
    import pulp

INF = float("inf")


class LinearModel:
    """Columns by name, rows as (coefficients, lower, upper), a minimised objective (module docstring)."""

    def __init__(self) -> None:
        self.columns: dict[str, tuple[float, float, bool]] = {}  # name -> (lower, upper, integer)
        self.rows: list[tuple[dict[str, float], float, float]] = []
        self.objective: dict[str, float] = {}
        self.objective_constant = 0

    def column(self, name: str, *, integer: bool = False) -> str:
        """A column in [0, 1] (binary when ``integer``), returned by name."""
        self.columns[name] = (0.0, 1.0, integer)
        return name

    def row(self, terms, *, low: float = -INF, up: float = INF) -> None:
        """sum of (column, coefficient) ``terms`` within [low, up], merged per column as PuLP merges them."""
        coefficients: dict[str, float] = {}
        for name, c in terms:
            _finite(c)
            coefficients[name] = coefficients[name] + c if name in coefficients else c
        self.rows.append((coefficients, low, up))

    def minimise(self, terms, constant: float = 0) -> None:
        """The objective: ``terms`` (column, coefficient), a zero coefficient naming no column (PuLP's ``0 * x``)."""
        for name, c in terms:
            if _finite(c) != 0:
                self.objective[name] = self.objective[name] + c if name in self.objective else c
        self.objective_constant = constant

    def ordered(self) -> list[str]:
        """The columns as PuLP hands them to a solver: those named anywhere, sorted by name (module docstring)."""
        named = set(self.objective)
        for coefficients, _, _ in self.rows:
            named.update(coefficients)
        if not self.objective:
            named.add("__dummy")
        return sorted(named)

    def key(self) -> tuple:
        """All HiGHS is handed (:func:`highs_model`): the columns in order, their bounds and costs, and the rows."""
        names = self.ordered()
        columns = tuple((name, self.bounds(name), self.cost(name)) for name in names)
        return columns, tuple((tuple(coefficients.items()), low, up) for coefficients, low, up in self.rows)

    def bounds(self, name: str) -> tuple[float, float, bool]:
        return (0.0, 0.0, False) if name == "__dummy" else self.columns[name]

    def cost(self, name: str) -> float:
        return 1.0 if name == "__dummy" and not self.objective else self.objective.get(name, 0.0)


def _finite(c: float) -> float:
    """``c``, refused when not finite as PuLP refuses it (``Cannot multiply variables with NaN/inf values``)."""
    if not math.isfinite(c):
        raise ValueError(f"a model coefficient is {c}: not finite")
    return c


def solve(
    model: LinearModel, *, solver: str, time_limit_s: float, memo: dict | None = None
) -> tuple[SolveStatus, dict[str, float]]:
    """Solve ``model``: its status and each column's value (HiGHS directly; CBC, or no highspy, through PuLP).
    ``memo``: HiGHS's answers kept on all it is handed (:meth:`LinearModel.key` and the time limit), so a model
    equal in those (apart in its objective's constant) runs once; the objective is summed from its own terms."""
    highspy = _highspy()
    if solver != "highs" or highspy is None:
        return _solve_pulp(model, solver=solver, time_limit_s=time_limit_s)
    if memo is None:
        return _solve_highs(highspy, model, time_limit_s=time_limit_s)
    key = (model.key(), float(time_limit_s))
    if key not in memo:
        memo[key] = _solve_highs(highspy, model, time_limit_s=time_limit_s)
    status, values = memo[key]
    return replace(status, objective=_objective(model, values) if status.objective is not None else None), values


def _highspy():
    """highspy, or None where it cannot be imported (then PuLP runs every solver)."""
    try:
        import highspy
    except ImportError:
        return None
    return highspy


def memoises(solver: str) -> bool:
    """Whether :func:`solve` runs ``solver`` itself and keeps its answers in a memo given it: HiGHS, where highspy
    imports; PuLP's runs (CBC, or HiGHS without highspy) are not kept."""
    return solver == "highs" and _highspy() is not None


def _objective(model: LinearModel, values: dict[str, float]) -> float:
    """The model's objective at ``values``: its constant and its terms, in the order they were named."""
    return model.objective_constant + sum(c * values[name] for name, c in model.objective.items())


def _solve_highs(highspy, model: LinearModel, *, time_limit_s: float) -> tuple[SolveStatus, dict[str, float]]:
    start = time.perf_counter()
    with _quiet_stdout():
        h, names = highs_model(highspy, model, time_limit_s=time_limit_s)
        h.run()
    elapsed = time.perf_counter() - start
    values = dict(zip(names, h.getSolution().col_value))
    status, gap = _highs_status(highspy, h)
    objective = None if status == "infeasible" else _objective(model, values)
    return SolveStatus(status=status, solver="highs", gap=gap, objective=objective, solve_time_s=elapsed), values


def highs_model(highspy, model: LinearModel, *, time_limit_s: float):
    """A ``highspy.Highs`` holding ``model`` as PuLP's HiGHS API would build it, with its options (module
    docstring, solve/backend.py), not yet run; and the columns' names in order."""
    import numpy as np

    names = model.ordered()
    h = highspy.Highs()
    for key, value in (("output_flag", False), ("threads", 1), ("time_limit", float(time_limit_s))):
        h.setOptionValue(key, value)
    for key, value in backend.HIGHS_OPTIONS.items():
        h.setOptionValue(key, value)
    _add_rows(h, model, np)
    bounds = [model.bounds(name) for name in names]
    starts, rows, values = _columns(model, names)
    low, up = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
    h.addCols(len(names), np.array([model.cost(n) for n in names]), low, up, len(rows), starts, rows, values)
    integer = np.array([i for i, b in enumerate(bounds) if b[2]], dtype=np.int32)
    if len(integer):
        h.changeColsIntegrality(len(integer), integer, np.full(len(integer), 1, dtype=np.uint8))
    return h, names


def _add_rows(h, model: LinearModel, np) -> None:
    """The rows' bounds, no entries yet: the columns bring them (:func:`_columns`)."""
    if model.rows:
        lows = np.array([low for _, low, _ in model.rows], dtype=np.float64)
        ups = np.array([up for _, _, up in model.rows], dtype=np.float64)
        h.addRows(len(model.rows), lows, ups, 0, [], [], [])


def _columns(model: LinearModel, names: list[str]):
    """The matrix by columns, each column's entries in row order, zeros dropped: the column-wise matrix PuLP's
    row-by-row ``addRow`` calls leave in HiGHS (the same starts, indices and values)."""
    import numpy as np

    index = {name: i for i, name in enumerate(names)}
    cols, rows, values = [], [], []
    for r, (coefficients, _, _) in enumerate(model.rows):
        for name, c in coefficients.items():
            if c != 0:
                cols.append(index[name])
                rows.append(r)
                values.append(c)
    order = np.argsort(np.array(cols, dtype=np.int64), kind="stable")  # by column, rows kept in order within one
    counts = np.bincount(np.array(cols, dtype=np.int64), minlength=len(names))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int32)
    return starts, np.array(rows, dtype=np.int32)[order], np.array(values, dtype=np.float64)[order]


def _highs_status(highspy, h) -> tuple[str, float | None]:
    """PuLP's reading of HiGHS's model status (``findSolutionValues``), as backend.solve_model reports it."""
    kind = h.getModelStatus()
    statuses = highspy.HighsModelStatus
    if kind == statuses.kOptimal:
        return "optimal", 0.0
    stopped = (statuses.kObjectiveBound, statuses.kObjectiveTarget, statuses.kInterrupt)
    limits = (statuses.kTimeLimit, statuses.kIterationLimit)
    if kind in stopped or (kind in limits and h.getObjectiveValue() != INF):
        return "time_limit", float(h.getInfo().mip_gap)
    return "infeasible", None


def to_pulp(model: LinearModel) -> tuple[pulp.LpProblem, dict[str, pulp.LpVariable]]:
    """The same model as a PuLP problem (for CBC)."""
    import pulp

    problem = pulp.LpProblem("intra_op", pulp.LpMinimize)
    cols = {
        name: variable(problem, name, low=low, up=up, cat="Binary" if integer else "Continuous")
        for name, (low, up, integer) in model.columns.items()
    }
    for coefficients, low, up in model.rows:
        expr = pulp.LpAffineExpression({cols[name]: c for name, c in coefficients.items()})  # zeros kept, as merged
        if low == up:
            problem += expr == low
        elif low > -INF:
            problem += expr >= low
        if up < INF and low != up:
            problem += expr <= up
    objective = {cols[name]: c for name, c in model.objective.items()}
    problem += pulp.LpAffineExpression(objective, constant=model.objective_constant)
    return problem, cols


def _solve_pulp(model: LinearModel, *, solver: str, time_limit_s: float) -> tuple[SolveStatus, dict[str, float]]:
    problem, cols = to_pulp(model)
    status = solve_model(problem, solver=solver, time_limit_s=time_limit_s)
    return status, {name: col.value() for name, col in cols.items()}
