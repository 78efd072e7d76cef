"""The experts' own layout in the search (autoplan/solve/expert_layout.py): offered beside tp > 1 only
where the runtime runs it, with sequence parallelism, pinnable with --fix, explained in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.moe import MIXTRAL_BATCH, mixtral_graph

from autoplan.cli import main
from autoplan.cost import CostModel
from autoplan.errors import PlanError
from autoplan.export import megatron
from autoplan.report.expert_layout import expert_layout_why
from autoplan.solve.api import plan_graph
from autoplan.solve.candidates import SearchOptions
from autoplan.solve.pins import parse_fixes
from autoplan.solve.search import Search

pytest.importorskip("transformers")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf_mixtral.py"


@pytest.fixture(scope="module")
def graph():
    return mixtral_graph()


def _layouts(result) -> set[tuple[int, int, int, bool]]:
    """(tp, ep, expert_tp, sp) of every priced candidate."""
    return {(c.plan.tp, c.plan.ep, c.plan.expert_tp, c.plan.sequence_parallel) for c in result.candidates if c.plan}


def test_folding_is_offered_for_megatron_with_sequence_parallelism_only(graph):
    search = Search(
        graph,
        synthetic_profile(),
        SearchOptions(devices=4, batch_size=MIXTRAL_BATCH, runtime="megatron", fixes=parse_fixes("tp=2"), keep=10**6),
    )
    result = search.run()
    folded = {layout for layout in _layouts(result) if layout[1] * layout[2] > 1}
    assert {(2, 2, 1, True), (2, 2, 2, True), (2, 1, 2, True), (2, 4, 1, True)} <= folded
    assert all(sp for _tp, _ep, _etp, sp in folded)
    priced = [c for c in result.candidates if c.cost is not None and c.plan.ep * c.plan.expert_tp > 1]
    assert priced and all(c.lower_bound <= c.objective * (1 + 1e-9) for c in priced)  # the bound stays a bound


def test_autoplan_runtime_is_offered_the_experts_own_layout_at_zero_0_and_1_only(graph):
    """autoplan's executor folds ep over tp ranks and splits the experts over expert_tp at ZeRO 0 and 1
    (execute/expert_parallel.py, execute/expert_tp.py): the search offers exactly that, with sequence
    parallelism, and `--fix expert_tp=2` narrows it to the expert_tp=2 layouts."""
    opts = SearchOptions(devices=4, batch_size=MIXTRAL_BATCH, fixes=parse_fixes("tp=2"), keep=10**6)
    result = Search(graph, synthetic_profile(), opts).run()
    folded = [c.plan for c in result.candidates if c.plan and c.plan.ep * c.plan.expert_tp > 1]
    assert {(p.tp, p.ep, p.expert_tp, p.sequence_parallel) for p in folded} == {
        (2, 2, 1, True), (2, 4, 1, True), (2, 1, 2, True), (2, 2, 2, True)
    }  # fmt: skip
    assert {p.zero_stage for p in folded} == {0, 1}
    assert any(c.plan and c.plan.ep == 1 and c.plan.zero_stage > 0 for c in result.candidates)
    pinned = plan_graph(graph, devices=4, profile=synthetic_profile(), batch_size=MIXTRAL_BATCH, fix="expert_tp=2,tp=2")
    assert (pinned.best.expert_tp, pinned.best.sequence_parallel) == (2, True) and pinned.best.zero_stage <= 1
    model = CostModel(graph, synthetic_profile())  # explain's sentence for it (report/expert_layout.py)
    why = expert_layout_why(model, pinned.best, model.estimate(pinned.best))
    assert why.startswith(f"expert_tp=2 x ep={pinned.best.ep} x edp=") and "all-to-all and etp collectives" in why
    assert "with every expert on every rank (ep=1, expert_tp=1) the step takes" in why and why.count(". ") == 0


@pytest.mark.parametrize(
    ("runtime", "fix", "words"),
    [
        (
            "autoplan",
            "expert_tp=2,tp=2,zero=2",
            "runtime 'autoplan' runs the experts' own layout beside tp > 1 at zero=0",
        ),
        ("autoplan", "ep=2,tp=2,zero=3", "runtime 'autoplan' runs the experts' own layout beside tp > 1 at zero=0"),
        ("torchtitan", "ep=2,tp=2", "runtime 'torchtitan' runs expert parallelism at tp = 1 only"),
        ("megatron", "ep=2,tp=2,sp=off", "differ across tp ranks only under sequence parallelism"),
    ],
)
def test_a_layout_pin_the_runtime_cannot_take_is_one_sentence(graph, runtime, fix, words):
    with pytest.raises(PlanError, match=None) as info:
        plan_graph(graph, devices=4, profile=synthetic_profile(), batch_size=MIXTRAL_BATCH, fix=fix, runtime=runtime)
    assert words in str(info.value)
    dense = synthetic_gpt(layers=2, hidden=128, heads=4, vocab=512, seq=64, batch=8)
    with pytest.raises(PlanError, match="needs a Mixture-of-Experts model"):
        plan_graph(dense, devices=4, profile=synthetic_profile(), batch_size=8, fix="expert_tp=2", runtime="megatron")


def test_plan_cli_pins_the_expert_layout_explains_it_and_exports_it(tmp_path, monkeypatch, capsys):
    for name, value in dict(LAYERS=2, DIM=64, FFN=128, EXPERTS=4, VOCAB=512, SEQ=32).items():
        monkeypatch.setenv(f"AUTOPLAN_HF_MIXTRAL_{name}", str(value))
    out = tmp_path / "out"
    code = main(["plan", str(EXAMPLE), "--devices", "8", "--profile", "dgx-h100", "--batch", "16", "--runtime",
                 "megatron", "--fix", "expert_tp=2,ep=2,tp=2", "--out", str(out), "--explain", "--json"])  # fmt: skip
    assert code == 0
    plan = json.loads((out / "plan.json").read_text())
    assert (plan["tp"], plan["ep"], plan["expert_tp"], plan["sequence_parallel"]) == (2, 2, 2, True)
    assert "expert_tp" in (out / "plans.csv").read_text().splitlines()[0].split(",")  # shown where a plan sets it
    why = json.loads(capsys.readouterr().out)["explanation"]["experts"]
    assert why.startswith("expert_tp=2 x ep=2 x edp=2 gives each rank 1/4 of the routed experts")
    assert "with every expert on every rank (ep=1, expert_tp=1) the step takes" in why and why.count(". ") == 0
    assert main(["export", str(out), "--to", "megatron", "--out", str(tmp_path) + "/"]) == 0
    text = (tmp_path / megatron.FILENAME).read_text()
    assert "--expert-tensor-parallel-size 2" in text and "--expert-model-parallel-size 2" in text
    assert megatron.read(text).fields["expert_tp"] == 2
    refused = main(["plan", str(EXAMPLE), "--devices", "8", "--profile", "dgx-h100", "--batch", "16",
                    "--fix", "expert_tp=2,tp=2,zero=2", "--out", str(tmp_path / "bad")])  # fmt: skip
    assert refused != 0


def test_experts_with_biases_get_no_expert_tp_since_megatron_refuses_it(graph):
    """Megatron-Core's TransformerConfig: 'Bias in Moe is only supported when ETP==1' (what its start-up
    check found over the export, tests/unit/export/test_megatron.py): not searched, a pin one sentence."""
    from dataclasses import replace

    from autoplan.solve.expert_layout import layout_options

    both = layout_options(dp=2, tp=2, cp=1, eps=(1, 2), fixes={}, runtime="megatron")
    assert (2, 2) in both and (1, 2) in both
    biased = layout_options(dp=2, tp=2, cp=1, eps=(1, 2), fixes={}, runtime="megatron", etp_ok=lambda e: False)
    assert biased == [(1, 1), (2, 1)]
    moe = graph.moe_layers[0]
    with_bias = replace(graph, moe_layers=[replace(moe, expert_param_names=[*moe.expert_param_names, "e.bias"])])
    with pytest.raises(PlanError, match="routed experts hold biases"):
        plan_graph(with_bias, devices=4, profile=synthetic_profile(), batch_size=MIXTRAL_BATCH,
                   fix="expert_tp=2,tp=2", runtime="megatron")  # fmt: skip
