"""A model with sparse embedding gradients is offered only what the executor runs (DDP: ZeRO-0,
tp = pp = cp = 1, fp32 uncompressed), a pin outside that is one sentence, and a model without
them keeps today's space (solve/sparse_grads.py)."""

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.errors import PlanError
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search


def _sparse(graph):
    params = dict(graph.parameters)
    params["wte.weight"] = replace(params["wte.weight"], sparse_grad=True)
    return replace(graph, parameters=params)


@pytest.fixture(scope="module")
def dense():
    return synthetic_gpt(layers=2, hidden=256, vocab=4096, seq=128, batch=16)


def _priced(graph, keep: int = 10**6, **options):
    search = Search(graph, synthetic_profile(), SearchOptions(devices=8, batch_size=16, keep=keep, **options))
    priced = [c for c in search.run().candidates if c.cost is not None and c.status == "evaluated"]
    assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in priced)  # the bounds hold without the tables too
    return [c.plan for c in priced]


def _runs_sparse(plan) -> bool:
    exact = plan.grad_compression == "none" and plan.grad_reduce_dtype == "fp32" and plan.offload == "none"
    return plan.tp == plan.pp == plan.cp == 1 and plan.zero_stage == 0 and exact


def test_sparse_tables_narrow_the_space_to_ddp(dense):
    offered = _priced(dense, keep=10, allow_lossy=True)  # its best ten exact, not its whole space priced
    assert not all(_runs_sparse(p) for p in offered)  # the dense model is offered tp, pp, ZeRO, compression
    narrowed = _priced(_sparse(dense), allow_lossy=True)
    assert narrowed and all(_runs_sparse(p) for p in narrowed)
    assert {p.dp for p in narrowed} == {8}


@pytest.mark.parametrize("pin", ["zero=1", "tp=2", "pp=2", "offload=optimizer"])
def test_a_pin_that_cannot_run_sparse_gradients_is_one_sentence(dense, pin):
    with pytest.raises(PlanError, match=r"^--fix .* cannot run wte\.weight, whose gradients are sparse"):
        Search(_sparse(dense), synthetic_profile(), SearchOptions(devices=8, batch_size=16, fixes=parse_fixes(pin)))
