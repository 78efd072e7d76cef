"""The search builds its candidates unchecked (Plan.unchecked) and checks only the ones it prices: every
candidate it builds must still pass a Plan's checks, so a rule of solve/space.py that offered what a Plan
refuses would show here, not as a silently pruned row."""

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.profiles import synthetic_host

from autoplan.errors import PlanError
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.search import Search
from autoplan.types.plan import Plan

DEGREES = dict(devices=16, dp=4, tp=2, pp=2, micro_batch_size=1, num_microbatches=4)


def test_every_candidate_the_search_builds_passes_the_checks(monkeypatch):
    built = []
    unchecked = Plan.unchecked

    def checking(**values):
        plan = unchecked(**values)
        built.append(replace(plan))  # replace() builds a Plan through __init__: every check runs
        return plan

    monkeypatch.setattr(Plan, "unchecked", checking)
    graph = synthetic_gpt(layers=4, hidden=512, heads=8, vocab=8000, seq=256, batch=4)
    profile = replace(synthetic_profile(), host=synthetic_host())  # offload is offered too
    options = SearchOptions(devices=8, batch_size=4, keep=1000, allow_lossy=True, allow_fp8=True)
    everything = Search(graph, profile, options)
    everything._beaten = lambda bound: False  # build every candidate of the space
    result = everything.run()
    assert len(built) > 1000 and result.best is not None
    shapes = {(p.dp, p.tp, p.pp, p.cp, p.zero_stage, p.offload, p.grad_compression, p.precision) for p in built}
    assert len(shapes) > 50  # the space's dimensions, not one corner of it


def test_unchecked_plan_equals_the_checked_one_and_checks_on_request():
    assert Plan.unchecked(**DEGREES) == Plan(**DEGREES)
    assert Plan.unchecked(**DEGREES).stages is not Plan.unchecked(**DEGREES).stages  # fresh lists, as __init__'s
    wrong = Plan.unchecked(**{**DEGREES, "dp": 3})
    with pytest.raises(PlanError, match="must equal devices"):
        wrong.checked()
    with pytest.raises(TypeError, match="devices"):
        Plan.unchecked(**{k: v for k, v in DEGREES.items() if k != "devices"})
    with pytest.raises(TypeError, match="Plan fields only"):
        Plan.unchecked(**DEGREES, stage_count=2)
