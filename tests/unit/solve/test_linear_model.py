"""solve/linear.py hands HiGHS the intra-op ILP PuLP's HiGHS API would build from the same rows: the same
columns, costs, bounds, integrality and column-wise matrix (starts, indices, values), so the same solve runs."""

import highspy
import numpy as np
import pytest
from test_solve_ilp import CASES, _problem

from autoplan.solve import backend, intra_op, linear

POINTS = [(2, False, 1), (4, True, 4), (8, False, 16)]
LP_FIELDS = ("num_col_", "num_row_", "col_cost_", "col_lower_", "col_upper_", "row_lower_", "row_upper_")


def _models(monkeypatch, problem, budget=None) -> list[linear.LinearModel]:
    """The LinearModel solve_block builds for ``problem`` (and its answer, solved directly)."""
    seen = []
    real = linear.solve
    monkeypatch.setattr(intra_op, "solve", lambda model, **kw: (seen.append(model), real(model, **kw))[1])
    intra_op.solve_block(problem, memory_budget_bytes=budget)
    return seen


def _through_pulp(model: linear.LinearModel):
    """The same model built by PuLP's HiGHS API and solved there: its HiGHS LP and column values."""
    problem, cols = linear.to_pulp(model)
    backend.solve_model(problem, solver="highs", time_limit_s=10)
    return problem.solverModel.getLp(), {name: col.value() for name, col in cols.items()}


def _assert_same_lp(direct, pulp_lp) -> None:
    for field in LP_FIELDS:
        assert np.array_equal(np.atleast_1d(getattr(direct, field)), np.atleast_1d(getattr(pulp_lp, field))), field
    assert list(direct.integrality_) == list(pulp_lp.integrality_)
    a, b = direct.a_matrix_, pulp_lp.a_matrix_
    assert a.format_ == b.format_ == highspy.MatrixFormat.kColwise
    assert (list(a.start_), list(a.index_), list(a.value_)) == (list(b.start_), list(b.index_), list(b.value_))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tp, sp, mbs", POINTS)
def test_direct_highs_model_is_pulps_and_answers_alike(case, tp, sp, mbs, monkeypatch):
    for layer in ("h.0", None):
        problem = _problem(case, tp=tp, sp=sp, mbs=mbs, layer=layer, param_bytes_factor=4.0, activation_factor=1.0)
        fastest = intra_op.solve_block(problem).memory_bytes
        for budget in (None, (fastest + problem.min_memory_bytes()) / 2):
            (model,) = _models(monkeypatch, problem, budget)
            direct, names = linear.highs_model(highspy, model, time_limit_s=10)
            pulp_lp, pulp_values = _through_pulp(model)
            _assert_same_lp(direct.getLp(), pulp_lp)
            status, values = linear.solve(model, solver="highs", time_limit_s=10)
            assert status.status == "optimal" and values == pulp_values


def test_a_model_without_costs_gets_pulps_dummy_column():
    model = linear.LinearModel()
    x = model.column("x", integer=True)
    model.row([(x, 1)], low=1, up=1)
    model.minimise([(x, 0.0)], 2.5)
    assert model.ordered() == ["__dummy", "x"]
    direct, _ = linear.highs_model(highspy, model, time_limit_s=10)
    _assert_same_lp(direct.getLp(), _through_pulp(model)[0])
    status, values = linear.solve(model, solver="highs", time_limit_s=10)
    assert (status.status, status.objective, values["x"]) == ("optimal", 2.5, 1.0)


def test_merged_and_zero_coefficients_as_pulp_merges_them():
    model = linear.LinearModel()
    a, b = model.column("a"), model.column("b", integer=True)
    model.row([(a, 1), (b, 2), (a, -1)], up=1)  # a's coefficient merges to 0: a row entry dropped, a kept
    model.row([(b, 1)], low=-1)
    model.minimise([(b, -1.0), (a, 0.0)])
    direct, names = linear.highs_model(highspy, model, time_limit_s=10)
    assert names == ["a", "b"]
    _assert_same_lp(direct.getLp(), _through_pulp(model)[0])
    with pytest.raises(ValueError, match="not finite"):
        model.row([(a, float("nan"))])


def test_the_planners_highs_runs_without_feasibility_jump(monkeypatch):
    """solve/backend.py HIGHS_OPTIONS reach the directly built HiGHS model, read when it is built."""
    model = linear.LinearModel()
    model.minimise([(model.column("x", integer=True), 1.0)])
    direct, _ = linear.highs_model(highspy, model, time_limit_s=10)
    answer = direct.getOptionValue("mip_heuristic_run_feasibility_jump")
    assert (answer[1] if isinstance(answer, tuple) else answer) is False
    monkeypatch.setattr(backend, "HIGHS_OPTIONS", {})
    direct, _ = linear.highs_model(highspy, model, time_limit_s=10)
    answer = direct.getOptionValue("mip_heuristic_run_feasibility_jump")
    assert (answer[1] if isinstance(answer, tuple) else answer) is True
