"""ZeRO-Offload on one data-parallel rank (Ren et al.'s one-GPU setup): ``offload=optimizer`` at ZeRO-0 with
dp x cp = 1, alone or beside tp and pp, is a valid plan, priced with the whole parameter vector on the host
link, and the search offers it (types/offload.py ``one_rank_offload``; docs/cost-model.md, "Offload")."""

from __future__ import annotations

from dataclasses import replace

import pytest
from synthetic import synthetic_gpt, synthetic_host, synthetic_profile

from autoplan.cost import CostModel
from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph
from autoplan.types.plan import Plan

HOST = synthetic_host()
GRAPH = synthetic_gpt(layers=4, hidden=1024, heads=16, vocab=32000, seq=1024, batch=8)


def _profile(memory_gib: float = 40.0):
    return replace(synthetic_profile(memory_bytes=int(memory_gib * 2**30)), host=HOST)


def _plan(**kw) -> Plan:
    base = dict(devices=1, dp=1, tp=1, pp=1, micro_batch_size=1, num_microbatches=8, precision="bf16")
    return Plan(**{**base, "offload": "optimizer", **kw})


def test_one_rank_takes_the_optimizer_offload_at_zero_0_and_nothing_else():
    assert _plan().describe().endswith("zero=0 rc=none bf16 offload=optimizer")
    assert _plan(devices=2, tp=2).offload == "optimizer"
    with pytest.raises(PlanError, match=r"needs zero_stage 1, dp > 1 \(or zero_stage 0 on one dp x cp rank\)"):
        _plan(zero_stage=1)
    with pytest.raises(PlanError, match="needs zero_stage 3, dp > 1 and ep = 1"):
        _plan(offload="full", zero_stage=3)


def test_the_whole_vector_crosses_the_link_and_leaves_no_optimizer_state_on_the_device():
    model = CostModel(GRAPH, _profile())
    plain, offloaded = model.estimate(_plan(offload="none")), model.estimate(_plan())
    params = GRAPH.param_count
    paid = offloaded.extra["offload"]
    assert (paid["down_bytes"], paid["up_bytes"], paid["host_bytes"]) == (4 * params, 4 * params, 16 * params)
    assert offloaded.optimizer_bytes == 0 and plain.optimizer_bytes == 8 * params
    assert offloaded.optimizer_s == pytest.approx(8 * params / HOST.link_bytes_per_s + params / HOST.adam_params_per_s)


def test_the_search_offloads_on_one_device_where_nothing_fits_without():
    with pytest.raises(PlanError, match="no plan fits in device memory"):
        plan_graph(GRAPH, devices=1, profile=_profile(2.0), batch_size=8, fix="offload=none")
    picked = plan_graph(GRAPH, devices=1, profile=_profile(2.0), batch_size=8)
    assert picked.best.dp == 1 and picked.best.offload == "optimizer" and picked.best_cost.feasible
    assert plan_graph(GRAPH, devices=1, profile=_profile(3.0), batch_size=8).best.offload == "none"
    pinned = plan_graph(GRAPH, devices=1, profile=_profile(), batch_size=8, fix="dp=1,zero=0,offload=optimizer")
    assert pinned.best.offload == "optimizer"
