"""The audit's price at the routing a run had (cost/moe/routed_rows.py): under expert parallelism a rank's ep
all-to-all bytes and expert GEMM FLOPs follow the rows its experts receive, so the prediction carries the rows at
balanced routing and what each row more adds, as the mechanism states them: a row is ``H b`` bytes in each
all-to-all whose input is the received rows (each forward run's combine, the dispatch's gradient), and ``2 H F``
FLOPs in each of the expert's projections (gate, up, down), twice that in the backward."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from synthetic import synthetic_profile
from synthetic.moe import mixtral_graph

from autoplan.cost.model import CostModel
from autoplan.cost.volumes import predict
from autoplan.types.audit_prediction import A2A_ROW, BACKWARD_FLOPS, FORWARD_FLOPS
from autoplan.types.plan import Plan

MBS, M = 2, 2


@pytest.fixture(scope="module")
def graph():
    return mixtral_graph()  # tests/synthetic/moe.py: traced once per session


def _predicted(graph, **changes):
    fields = dict(devices=8, dp=8, tp=1, pp=1, ep=4, micro_batch_size=MBS, num_microbatches=M, precision="bf16")
    return predict(CostModel(graph, synthetic_profile()), Plan(**{**fields, **changes}))[0]


def _balanced_rows(graph) -> float:
    """A rank's experts' rows per step at balanced routing: every layer's E C f, each micro-batch."""
    return sum(moe.num_experts * moe.slots_per_expert * MBS / graph.batch_size * M for moe in graph.moe_layers)


@pytest.mark.parametrize(
    "recompute, runs, a2a, fwd, bwd",
    [("none", 1, 2.0, 1.0, 2.0), ("full", 2, 1.5, 0.5, 1.5), ("selective", 2, 1.0, 0.5, 1.0)],
)
def test_each_row_a_rank_receives_adds_its_bytes_and_flops(graph, recompute, runs, a2a, fwd, bwd):
    """Per counted row (the dispatch counts a layer's rows once per run of its forward: recomputation re-runs it):
    none, H b twice (combine, dispatch gradient); full recompute re-sends the combine and re-runs the GEMMs in the
    backward; selective keeps the all-to-alls' outputs and the GEMMs' (types/saved_ops.py)."""
    moe = graph.moe_layers[0]
    h, f = moe.hidden_size, moe.expert_ffn_size
    pred = _predicted(graph, recompute=recompute)
    assert pred.expert_rows == pytest.approx(runs * _balanced_rows(graph), rel=1e-12)
    projections = 3 if moe.gated else 2
    assert pred.per_expert_row == pytest.approx(
        {
            A2A_ROW: a2a * h * 2,
            FORWARD_FLOPS: fwd * projections * 2 * h * f,
            BACKWARD_FLOPS: bwd * projections * 2 * h * f,
        },
        rel=1e-12,
    )


def test_without_expert_parallelism_no_row_moves_the_price(graph):
    """At ep = 1 every rank runs every expert on its own tokens: nothing follows the routing."""
    pred = _predicted(graph, ep=1)
    assert (pred.expert_rows, pred.per_expert_row) == (0.0, {})


def test_each_layer_looks_among_the_batched_matmuls_alone_and_finds_what_a_scan_of_every_node_finds(graph, monkeypatch):
    """The expert GEMMs of a layer (is_expert_gemm) come from batched_matmuls, listed once per node list: the
    per-row prices equal those of a scan of every node, fewer nodes are asked, and a new or longer node list is
    listed again."""
    from autoplan.cost.moe import routed_rows
    from autoplan.cost.moe.experts import is_expert_gemm

    asked = []
    monkeypatch.setattr(routed_rows, "is_expert_gemm", lambda n, moe: asked.append(n) or is_expert_gemm(n, moe))
    pred = _predicted(graph)
    assert 0 < len(asked) < len(graph.nodes) * len(graph.moe_layers) / 2
    monkeypatch.setattr(routed_rows, "batched_matmuls", lambda g: g.nodes)  # the plain scan
    assert _predicted(graph).per_expert_row == pred.per_expert_row
    monkeypatch.undo()
    plain = lambda g: [n for n in g.nodes if n.op in ("matmul", "linear") and len(n.output_shape) == 3]  # noqa: E731
    other = copy.copy(graph)  # its cache copied too
    other.nodes = [n for n in graph.nodes if n not in routed_rows.batched_matmuls(graph)[:1]]
    assert routed_rows.batched_matmuls(other) == plain(other) != plain(graph)
    other.nodes.append(routed_rows.batched_matmuls(graph)[0])  # the same list, one node longer
    assert routed_rows.batched_matmuls(other) == plain(other)


def test_the_written_prediction_holds_the_peak_at_balance_and_per_row(tmp_path, monkeypatch):
    """`autoplan run --audit`'s prediction (cli/rank.py) for examples/moe.py at dp = ep = 2 under the default routing
    model (imbalance 1.25): the balanced peak plus the plan's extra rows times the peak a row adds is the plan's
    peak, the busiest rank's expert activations being linear in its rows (cost/blocks.py)."""
    from autoplan.cli.rank import write_audit_prediction
    from autoplan.types.audit_prediction import PEAK, AuditPrediction
    from autoplan.types.moe import RoutingModel
    from autoplan.types.run_options import RunOptions

    for name, value in dict(LAYERS=2, DIM=16, HEADS=2, EXPERTS=4, VOCAB=64, SEQ=8).items():
        monkeypatch.setenv(f"AUTOPLAN_MOE_{name}", str(value))
    plan = Plan(devices=2, dp=2, tp=1, pp=1, ep=2, micro_batch_size=2, num_microbatches=2, routing=RoutingModel())
    model = Path(__file__).resolve().parents[3] / "examples" / "moe.py"
    opts = RunOptions(model=str(model), plan=str(plan.save(tmp_path / "plan.json")), out=str(tmp_path), audit=True)
    write_audit_prediction(opts, plan)
    (stage,) = AuditPrediction.load(tmp_path, plan=plan.describe()).stages
    extra = (plan.routing.imbalance - 1) * stage.expert_rows
    assert stage.per_expert_row[PEAK] > 0 and stage.balanced_peak_bytes < stage.peak_bytes
    assert stage.balanced_peak_bytes + extra * stage.per_expert_row[PEAK] == pytest.approx(stage.peak_bytes, rel=1e-9)
