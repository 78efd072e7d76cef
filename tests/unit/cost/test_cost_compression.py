"""Lossy gradient sync: PowerSGD's pricing against torch's own rule, the planner's choice on a
slow link, the --allow-lossy gate, bounds that stay bounds, and the explain trade."""

import math

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

from autoplan.cost import CostModel
from autoplan.cost.dp.compression import compresses, matrix_of, traffic_of
from autoplan.errors import PlanError
from autoplan.report.trade import trade_rows
from autoplan.solve.api import plan_graph
from autoplan.types import Plan


def _model():
    return synthetic_gpt(layers=4, hidden=512, heads=8, vocab=8000, seq=128, batch=32)


def _slow():
    """8-device nodes joined by 25 Gbit/s Ethernet (3 GB/s of bus bandwidth)."""
    return synthetic_profile(inter_busbw_bytes_per_s=3e9)


@pytest.mark.parametrize("shape", [[4096, 4096], [512, 2048], [8000, 512], [4096], [3, 3, 7, 7], [64, 3]])
@pytest.mark.parametrize("rank", [1, 4, 64])
def test_the_compression_rule_is_torchs(shape, rank):
    n, m = matrix_of(shape)
    assert compresses(n, m, rank) == _should_compress(n, m, min(n, m, rank), 2)[0]


def test_traffic_counts_factors_for_matrices_and_everything_for_vectors():
    t = traffic_of([[1024, 512], [512]], rank=4)
    assert t.elements == 1024 * 512 + 512
    assert t.uncompressed_elements == 512
    assert (t.p_elements, t.q_elements) == (1024 * 4, 512 * 4)
    assert t.sent_bytes == 4 * (512 + 1536 * 4)
    assert t.matmul_flops == 3 * 2 * 1024 * 512 * 4
    assert t.held_bytes == 4 * (t.elements + 1536 * 4)  # error feedback for all, plus P and Q


def _dp_plan(**changes):
    fields = dict(devices=32, dp=32, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    return Plan(**{**fields, **changes})


def test_powersgd_sends_fewer_bytes_costs_compute_and_holds_memory():
    model = CostModel(_model(), _slow())
    exact = model.estimate(_dp_plan())
    psgd = model.estimate(_dp_plan(grad_compression="powersgd", powersgd_rank=4))
    assert psgd.dp_comm_s < exact.dp_comm_s / 5
    assert psgd.compression_s > 0 and exact.compression_s == 0
    assert psgd.peak_memory_bytes > exact.peak_memory_bytes  # error feedback, about one fp32 gradient copy
    assert psgd.step_time_s == pytest.approx(sum(getattr(psgd, f) for f in psgd.TIME_FIELDS))
    rank8 = model.estimate(_dp_plan(grad_compression="powersgd", powersgd_rank=8))
    assert rank8.dp_comm_s > psgd.dp_comm_s
    assert rank8.compression_s >= psgd.compression_s  # thin matmuls stream M: memory-bound at small ranks


def test_bf16_reduction_halves_the_bytes_of_an_fp32_plan():
    model = CostModel(_model(), _slow())
    fp32 = model.estimate(_dp_plan(precision="fp32"))
    half = model.estimate(_dp_plan(precision="fp32", grad_reduce_dtype="bf16"))
    assert half.dp_comm_s == pytest.approx(fp32.dp_comm_s / 2, rel=0.05)


def test_the_planner_compresses_on_a_slow_link_only_when_allowed():
    graph = _model()
    strict = plan_graph(graph, devices=32, profile=_slow(), batch_size=32, fix={"tp": 1, "pp": 1})
    # synchronous replicas: DiLoCo every 500 steps, also lossy, would win here
    # (tests/unit/solve/test_local_sgd_search.py)
    synced = {"tp": 1, "pp": 1, "sync_every": 1}
    lossy = plan_graph(graph, devices=32, profile=_slow(), batch_size=32, fix=synced, allow_lossy=True)
    assert strict.best.lossy == [] and all(not c.plan.lossy for c in strict.candidates if c.plan)
    assert lossy.best.grad_compression == "powersgd" and lossy.best.powersgd_rank == 4
    assert lossy.best.predicted.step_time_s < strict.best.predicted.step_time_s / 1.5
    assert lossy.best.predicted.search.allow_lossy


def test_bounds_stay_below_the_priced_objective_with_lossy_options():
    synced = {"sync_every": 1}  # DiLoCo, also lossy, would win and its bound prune every compressed plan
    result = plan_graph(_model(), devices=32, profile=_slow(), batch_size=32, allow_lossy=True, fix=synced)
    evaluated = [c for c in result.candidates if c.status == "evaluated" and c.objective is not None]
    assert any(c.plan.grad_compression == "powersgd" for c in evaluated)
    assert any(c.plan.grad_reduce_dtype == "bf16" for c in evaluated)
    assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in evaluated)


@pytest.mark.parametrize(
    ("fix", "allow", "words"),
    [
        ({"powersgd": 4}, False, "--fix powersgd=4 is lossy (the optimizer then sees a rounded or compressed"),
        ({"reduce": "bf16"}, False, "add --allow-lossy to allow it."),
        ({"powersgd": 600}, True, "PowerSGD rank 600 is larger than every gradient matrix"),
    ],
)
def test_lossy_pins_and_impossible_ranks_are_one_sentence(fix, allow, words):
    with pytest.raises(PlanError, match=None) as info:
        plan_graph(_model(), devices=8, profile=_slow(), batch_size=32, fix=fix, allow_lossy=allow)
    assert words in str(info.value) and str(info.value).count(". ") == 0


def test_a_rank_that_compresses_nothing_is_refused():
    graph = synthetic_gpt(layers=2, hidden=64, heads=4, vocab=64, seq=16, batch=8)
    with pytest.raises(PlanError, match="compresses no gradient"):
        plan_graph(graph, devices=8, profile=_slow(), batch_size=8, fix={"powersgd": 40}, allow_lossy=True)


def test_the_trade_table_prices_each_option_against_the_chosen_plan():
    model = CostModel(_model(), _slow())
    plan = _dp_plan()
    rows = {r.option: r for r in trade_rows(model, plan, allowed=set())}
    assert rows["bf16, reduce fp32"].chosen and rows["bf16, reduce fp32"].vs_chosen == 1.0
    assert rows["bf16, reduce bf16"].lossy and not rows["bf16, reduce bf16"].allowed
    assert math.isclose(rows["bf16, reduce bf16"].grad_bytes_sent, rows["bf16, reduce fp32"].grad_bytes_sent / 2)
    ranks = [rows[f"bf16, PowerSGD rank {r}"] for r in (1, 2, 4, 8)]
    assert all(r.vs_chosen < 1 for r in ranks)
    assert [r.grad_bytes_sent for r in ranks] == sorted(r.grad_bytes_sent for r in ranks)
