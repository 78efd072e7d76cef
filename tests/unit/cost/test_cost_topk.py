"""Top-k sparsification with error feedback (issue 36 item 3): its plan rules, its price (bytes, the
selection's passes, the residual), the search under --allow-lossy and the pins."""

import math

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cost import CostModel
from autoplan.cost.dp.topk import PAIR_BYTES, SELECTION_PASSES, traffic_of
from autoplan.errors import PlanError
from autoplan.solve.api import plan_graph
from autoplan.solve.pins import parse_fixes
from autoplan.types import Plan


def _model():
    return synthetic_gpt(layers=2, hidden=256, heads=8, vocab=4000, seq=64, batch=32)


def _slow():
    return synthetic_profile(inter_busbw_bytes_per_s=3e9)


def _plan(**changes):
    fields = dict(devices=32, dp=32, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    return Plan(**{**fields, **changes})


def test_topk_ratio_is_validated_and_omitted_at_its_default():
    assert "topk_ratio" not in _plan().to_dict()
    plan = _plan(grad_compression="topk", topk_ratio=0.01)
    assert Plan.from_dict(plan.to_dict()) == plan and plan.lossy and "topk=0.01" in plan.describe()
    assert _plan(grad_compression="topk", topk_ratio=1.0).lossy == []  # every entry sent: exact
    for bad, words in [
        (dict(grad_compression="topk", topk_ratio=0.0), "in (0, 1]"),
        (dict(grad_compression="topk", topk_ratio=1.5), "in (0, 1]"),
        (dict(topk_ratio=0.01), "without grad_compression='topk'"),
        (dict(grad_compression="topk", topk_ratio=0.01, zero_stage=1), "DDP communication hook"),
        (dict(grad_compression="topk", topk_ratio=0.01, grad_reduce_dtype="bf16"), "fp32"),
    ]:
        with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
            _plan(**bad)


def test_traffic_counts_each_tensors_ceiling_pairs_and_a_residual_per_entry():
    t = traffic_of([1000, 7], ratio=0.01, ranks=4)
    assert t.selected == 10 + 1  # ceil(0.01 * 7) = 1: every tensor sends at least one entry
    assert t.sent_bytes == 4 * PAIR_BYTES * 11  # the all-gathered message: every rank's pairs
    assert t.held_bytes == 4 * 1007
    assert traffic_of([1000, 7], ratio=1.0, ranks=4).selected == 1007


def test_topk_sends_fewer_bytes_pays_its_passes_and_holds_its_residual():
    model = CostModel(_model(), _slow())
    exact = model.estimate(_plan())
    plan = _plan(grad_compression="topk", topk_ratio=0.001)
    sparse = model.estimate(plan)
    stages, _, _ = model.priced_stages(plan)
    traffic = model.powersgd_stage(plan, stages[0])
    trained = _model().trainable_param_count
    assert traffic.elements == trained and traffic.ranks == 32
    profile = _slow()
    memory_bw = profile.device.memory_bandwidth_bytes_per_s * profile.device.memory_efficiency
    assert sparse.compression_s == pytest.approx(SELECTION_PASSES * 4 * trained / memory_bw)
    assert sparse.dp_comm_s < exact.dp_comm_s / 3
    assert sparse.peak_memory_bytes >= exact.peak_memory_bytes + 4 * trained  # the fp32 residual
    whole = model.estimate(_plan(grad_compression="topk", topk_ratio=1.0))
    assert whole.dp_comm_s > exact.dp_comm_s  # all-gathering every pair costs p/2 all-reduces


def test_the_search_tries_dgc_ratios_only_under_allow_lossy_and_takes_pins():
    graph, profile = _model(), _slow()
    fix = {"tp": 1, "pp": 1}
    strict = plan_graph(graph, devices=32, profile=profile, batch_size=32, fix=fix)
    assert all(c.plan.grad_compression != "topk" for c in strict.candidates if c.plan)
    lossy = plan_graph(graph, devices=32, profile=profile, batch_size=32, fix=fix, allow_lossy=True)
    ratios = {c.plan.topk_ratio for c in lossy.candidates if c.plan and c.plan.grad_compression == "topk"}
    assert ratios == {0.001, 0.01}
    pins = {**fix, **parse_fixes("grad_compression=topk,topk_ratio=0.01")}
    pinned = plan_graph(graph, devices=32, profile=profile, batch_size=32, fix=pins, allow_lossy=True)
    assert (pinned.best.grad_compression, pinned.best.topk_ratio) == ("topk", 0.01)
    with pytest.raises(PlanError, match="add --allow-lossy"):
        plan_graph(graph, devices=32, profile=profile, batch_size=32, fix=pins)
    exact = {**fix, **parse_fixes("grad_compression=topk,topk_ratio=1")}  # exact: no --allow-lossy needed
    assert plan_graph(graph, devices=32, profile=profile, batch_size=32, fix=exact).best.topk_ratio == 1.0


@pytest.mark.parametrize(
    "text, words",
    [
        ("topk_ratio=0", "expected a fraction in (0, 1]"),
        ("topk_ratio=two", "expected a fraction in (0, 1]"),
        ("grad_compression=zip", "expected one of none, powersgd, topk"),
    ],
)
def test_bad_compression_pins_get_one_sentence(text, words):
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_fixes(text)


def test_contradicting_pins_get_one_sentence():
    with pytest.raises(PlanError, match="the ratio is top-k's"):
        plan_graph(
            _model(),
            devices=32,
            profile=_slow(),
            batch_size=32,
            fix=parse_fixes("grad_compression=powersgd,topk_ratio=0.01"),
            allow_lossy=True,
        )


def test_bounds_stay_below_the_topk_objective():
    result = plan_graph(_model(), devices=32, profile=_slow(), batch_size=32, fix={"tp": 1, "pp": 1}, allow_lossy=True)
    sparse = [c for c in result.candidates if c.status == "evaluated" and c.plan.grad_compression == "topk"]
    assert sparse and all(math.isfinite(c.objective) and c.lower_bound <= c.objective * (1 + 1e-9) for c in sparse)
