"""A pinned ``--fix schedule_steps=k`` in the search (solve/groups.py, solve/search.py): only pipelined groups whose
micro-batches k divides, the schedules one step's m / k runs, every plan priced as k schedule steps; the memory floors
and the partitions read one schedule step (cost/bounds.py, cost/memory/sent_floor.py, solve/partitions.py), so the
pruned search finds the best plan and price of the search that prices everything, and no floor exceeds a peak."""

from __future__ import annotations

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.exhaustive import priced_everything

from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search

#: long sequences, narrow blocks and many micro-batches: the tensors sent between stages weigh (test_sends_floor.py)
GRAPH = synthetic_gpt(layers=8, hidden=128, heads=4, vocab=512, seq=1024, batch=32)
SMALL = synthetic_profile(memory_bytes=int(0.06 * 2**30))


@pytest.mark.parametrize("fix", ["pp=4,mbs=1,schedule_steps=4", "pp=2,mbs=1,schedule_steps=2"])
def test_a_pinned_k_is_searched_exactly(fix):
    options = SearchOptions(devices=8, batch_size=32, fixes=parse_fixes(fix))
    pruned = Search(GRAPH, SMALL, options).run()
    search = priced_everything(Search(GRAPH, SMALL, options))
    every = search.run()
    assert pruned.best is not None and pruned.best.schedule_steps == options.fixes["schedule_steps"]
    assert (pruned.best.describe(), pruned.best.stages) == (every.best.describe(), every.best.stages)
    assert pruned.best_cost.step_time_s == every.best_cost.step_time_s
    priced = [c for c in every.candidates if c.cost is not None and c.plan is not None]
    assert priced and {c.plan.schedule_steps for c in priced} == {options.fixes["schedule_steps"]}
    for c in priced:
        floor = max(search.bounds.memory_floor_bytes(c.plan), search.bounds.sends.floor_bytes(c.plan))
        assert floor <= c.cost.peak_memory_bytes, c.plan.describe()


def test_the_pin_lets_a_plan_fit_that_one_schedule_step_cannot():
    """Pinned to one schedule step nothing fits; pinned to 4, or left to the search (solve/schedule_steps.py), it
    does."""
    fixes = "pp=4,mbs=1,tp=1,schedule=interleaved_1f1b,recompute=none"
    one = Search(GRAPH, SMALL, SearchOptions(devices=8, batch_size=32, fixes=parse_fixes(fixes + ",schedule_steps=1")))
    four = Search(GRAPH, SMALL, SearchOptions(devices=8, batch_size=32, fixes=parse_fixes(fixes + ",schedule_steps=4")))
    free = Search(GRAPH, SMALL, SearchOptions(devices=8, batch_size=32, fixes=parse_fixes(fixes))).run()
    assert one.run().best is None and four.run().best_cost.feasible  # 16 micro-batches' receive slots, or 4's
    assert free.best_cost.feasible and free.best.schedule_steps > 1


def test_a_runtime_without_torchs_schedules_refuses_the_pin_in_one_sentence():
    with pytest.raises(PlanError, match="only runtimes that run torch's pipeline schedules"):
        plan_graph(GRAPH, devices=8, profile=SMALL, fix="schedule_steps=2", runtime="megatron")
