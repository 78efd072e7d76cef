"""The search on several processes (solve/shares.py): the best plan, its price and an exact top k are the search's in
one process, every configuration keeps one row, and what a share's process does wrong reaches the user."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cli import main
from autoplan.errors import PlanError
from autoplan.solve import shares
from autoplan.solve.candidates import SearchOptions, rank_key
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search

pytestmark = pytest.mark.skipif(shares.usable_jobs(2) == 1, reason="the search forks only on Linux")

#: (graph, devices, device GiB, pins): a small space, a wide one whose best group is not the first by bound (1), and
#: a tight device whose plans step to larger schedule steps and fit recompute budgets
SPACES = {
    "small": (synthetic_gpt(layers=4, hidden=512, heads=8, vocab=8000, seq=256, batch=8), 8, 80, ""),
    "wide": (synthetic_gpt(layers=8, hidden=1024, heads=16, vocab=32000, seq=1024, batch=16), 16, 24, ""),
    "tight": (synthetic_gpt(layers=8, hidden=256, heads=8, vocab=512, seq=512, batch=16), 4, 0.06, "tp=1,pp=2"),
}


def _search(space: str, *, jobs: int, keep: int, progress=None):
    graph, devices, gib, pins = SPACES[space]
    options = SearchOptions(
        devices=devices, batch_size=graph.batch_size, fixes=parse_fixes(pins), keep=keep, jobs=jobs, progress=progress
    )
    return Search(graph, synthetic_profile(memory_bytes=int(gib * 2**30)), options).run()


def _top(result, k: int) -> list[tuple]:
    return [(c.objective, c.plan.describe(), tuple(c.plan.recompute_blocks)) for c in result.ranked()[:k]]


@pytest.mark.parametrize("space", SPACES)
def test_every_share_count_finds_the_one_process_best_and_exact_top(space):
    """keep 1 on 2 processes: the same best plan and price; keep 4 on 3: the same exact top 4, in order. Each
    configuration keeps its row whatever the shares (the rows' counts sum to no fewer: a share prices more, and a
    plan priced may add the rows of its retries: a recompute budget, a larger schedule step)."""
    for keep, jobs in ((1, 2), (4, 3)):
        alone, split = _search(space, jobs=1, keep=keep), _search(space, jobs=jobs, keep=keep)
        assert (alone.processes, split.processes) == (1, jobs)
        assert _top(split, keep) == _top(alone, keep)
        assert split.best.describe() == alone.best.describe() and split.best_cost == alone.best_cost
        assert split.evaluated + split.pruned >= alone.evaluated + alone.pruned
        assert split.ilp_solves >= alone.ilp_solves  # the children's ILPs are counted


def test_the_shares_depend_on_their_count_not_on_timing():
    """The same jobs twice: the same rows in the same order (nothing is shared while the shares run)."""
    rows = [[(c.status, c.objective, c.lower_bound) for c in _search("wide", jobs=2, keep=1).candidates]]
    rows.append([(c.status, c.objective, c.lower_bound) for c in _search("wide", jobs=2, keep=1).candidates])
    assert rows[0] == rows[1]


def test_the_progress_bar_counts_every_share_and_ends_full():
    seen = []
    result = _search("wide", jobs=2, keep=1, progress=lambda done, total: seen.append((done, total)))
    total = seen[-1][1]
    assert seen[-1] == (total, total) and all(done <= total for done, _ in seen)
    assert result.best is not None


def test_rank_key_orders_ties_by_configuration():
    """Two plans of one price and ranks: the order does not depend on which was priced first."""
    result = _search("small", jobs=1, keep=4)
    a, b = result.ranked()[:2]
    a.objective = b.objective
    a.plan.tp = b.plan.tp = a.plan.cp = b.plan.cp = a.plan.pp = b.plan.pp = 1
    assert sorted([a, b], key=rank_key) == sorted([b, a], key=rank_key)


class _Odd(Exception):
    """An error pickle cannot make again (its class needs an argument its args do not hold)."""

    def __init__(self, message: str, *, extra: int):
        super().__init__(message)
        self.extra = extra


def test_an_error_in_a_share_is_raised_in_the_parent(monkeypatch):
    """A child that raises: the same error, raised by the search the user called (or, where pickle cannot make it
    again, one sentence); one that dies without a word: one sentence naming its share and how it stopped."""
    evaluate = Search._evaluate

    def failing(self, *args, **kwargs):
        if shares._IN_CHILD:
            raise PlanError("a child's error")
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Search, "_evaluate", failing)
    with pytest.raises(PlanError, match="a child's error") as raised:
        _search("wide", jobs=2, keep=1)
    if sys.version_info >= (3, 11):  # with the child's traceback, where Python keeps notes
        assert "in the search's process for share 1 of 2" in raised.value.__notes__[0]

    def odd(self, *args, **kwargs):
        if shares._IN_CHILD:
            raise _Odd("made with a keyword", extra=1)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Search, "_evaluate", odd)
    with pytest.raises(PlanError, match=r"share 1 of 2 failed"):
        _search("wide", jobs=2, keep=1)

    def dying(self, *args, **kwargs):
        if shares._IN_CHILD:
            os._exit(3)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Search, "_evaluate", dying)
    with pytest.raises(PlanError, match=r"share 1 of 2 stopped \(exit status 3\).*--jobs 1"):
        _search("wide", jobs=2, keep=1)


def test_a_fork_that_fails_leaves_the_search_whole_in_one_process(monkeypatch):
    """The second of two forks refused (a process limit): the child already forked is ended and reaped, and the
    search goes on with every group in this process, the best plan and price of one process."""
    forked, fork = [], os.fork

    def refusing_fork():
        if forked:
            raise BlockingIOError("Resource temporarily unavailable")
        if (pid := fork()) != 0:
            forked.append(pid)
        return pid

    alone = _search("wide", jobs=1, keep=1)
    monkeypatch.setattr(os, "fork", refusing_fork)
    split = _search("wide", jobs=3, keep=1)
    assert split.processes == 1 and len(forked) == 1
    assert split.best.describe() == alone.best.describe() and split.best_cost == alone.best_cost
    assert split.evaluated + split.pruned == alone.evaluated + alone.pruned
    with pytest.raises(ChildProcessError):  # reaped already
        os.waitpid(forked[0], os.WNOHANG)


def test_an_interrupt_in_the_parent_ends_and_reaps_every_child(monkeypatch):
    """Ctrl-C while the shares run: the search raises KeyboardInterrupt (the CLI says "interrupted") and no child is
    left running or unreaped."""
    forked, evaluate, priced = [], Search._evaluate, []
    fork = os.fork

    def recorded_fork():
        if (pid := fork()) != 0:
            forked.append(pid)
        return pid

    def interrupted(self, *args, **kwargs):
        if forked and not shares._IN_CHILD and len(priced) >= 3:
            raise KeyboardInterrupt
        priced.append(1)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(os, "fork", recorded_fork)
    monkeypatch.setattr(Search, "_evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _search("wide", jobs=2, keep=1)
    assert len(forked) == 1
    with pytest.raises(ChildProcessError):  # reaped already
        os.waitpid(forked[0], os.WNOHANG)


def test_a_sweep_whose_points_search_on_two_processes_finds_the_same_front():
    """sweep_graph's ``jobs``: each point's search on 2 processes, the same rows (status, plan, whole-run hours and
    dollars) and Pareto front as on one."""
    from synthetic.profiles import rental_profile

    from autoplan.solve.cluster import sweep_graph

    graph = synthetic_gpt(layers=2, hidden=1024, heads=16, seq=1024, batch=256)
    profiles = [rental_profile(name="cheap", price=1.0, inter_busbw_bytes_per_s=5e9)]
    rows = []
    for jobs in (1, 2):
        result = sweep_graph(graph, devices=range(4, 33), profiles=profiles, run={"tokens": 1e10}, jobs=jobs)
        rows.append([(r.devices, r.status, r.plan and r.plan.describe(), r.estimate, r.reason) for r in result.rows])
        rows.append([(r.devices, r.wall_h) for r in result.pareto])
        assert {r.search.processes for r in result.rows if r.search} == {jobs}  # each point split
    assert rows[0] == rows[2] and rows[1] == rows[3]
    assert sum(status == "planned" for _, status, *_ in rows[0]) >= 2


MODEL = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"


def test_plan_on_two_processes_writes_the_plan_of_one(tmp_path, capsys):
    """``autoplan plan --jobs 2``: the same plan.json as ``--jobs 1`` but what the search counted, and it records
    and prints the two processes it ran on."""
    plans, titles = [], []
    for jobs in (1, 2):
        words = ["plan", str(MODEL), "--devices", "16", "--profile", "dgx-a100", "--batch", "32"]
        assert main([*words, "--jobs", str(jobs), "--out", str(tmp_path / str(jobs))]) == 0
        plans.append(json.loads((tmp_path / str(jobs) / "plan.json").read_text()))
        titles.append(next(line for line in capsys.readouterr().out.splitlines() if "plans (" in line))
    assert "processes" not in titles[0] and " s on 2 processes)" in titles[1]
    searches = [plan["predicted"].pop("search") for plan in plans]
    assert plans[0] == plans[1]
    assert [s["search_processes"] for s in searches] == [1, 2]
    assert searches[1]["candidates_evaluated"] >= searches[0]["candidates_evaluated"]


def test_jobs_that_are_not_a_count_are_one_sentence(monkeypatch, tmp_path, capsys):
    with pytest.raises(PlanError, match="--jobs -1 is negative"):
        shares.usable_jobs(-1)
    monkeypatch.setenv("AUTOPLAN_JOBS", "two")
    with pytest.raises(PlanError, match="AUTOPLAN_JOBS='two' is not a whole number"):
        shares.usable_jobs(0)
    monkeypatch.setenv("AUTOPLAN_JOBS", "3")
    assert shares.usable_jobs(0) == 3 and shares.usable_jobs(2) == 2
    code = main(
        ["plan", str(MODEL), "--devices", "2", "--profile", "dgx-a100", "--batch", "4", "--jobs", "-2"]
        + ["--out", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code != 0 and "--jobs -2 is negative" in err and "Traceback" not in err
