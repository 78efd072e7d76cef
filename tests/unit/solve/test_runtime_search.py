"""Under a runtime that runs its own attention (megatron, torchtitan), every price the search, its files and
explain read is of the same graph, the one ``CostModel.for_runtime`` prices: the bounds stay below the
priced plans, ops.csv and stages.csv sum to plan.json's price, and explain re-prices what plan.json says."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from autoplan.cli import main  # noqa: E402
from autoplan.cost import CostModel  # noqa: E402
from autoplan.profile import load_profile  # noqa: E402
from autoplan.report.explain import explain  # noqa: E402
from autoplan.solve.candidates import SearchOptions  # noqa: E402
from autoplan.solve.outputs import ops_csv, stages_csv  # noqa: E402
from autoplan.solve.search import Search  # noqa: E402
from autoplan.trace import trace, trace_model_file  # noqa: E402
from autoplan.types import Plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
BATCH = 4
SEQ = 2048  # long enough that the fused kernel beats eager attention's materialised scores
GPTM = {"N_LAYER": 2, "N_EMBD": 256, "N_HEAD": 4, "SEQ_LEN": SEQ, "VOCAB_SIZE": 512}
RUNTIMES = ("megatron", "torchtitan")


def _llama_eager():
    """HF Llama with eager attention (GQA: 4 heads, 2 KV heads) and its traced positional causal mask."""
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=128,
        max_position_embeddings=SEQ,
        use_cache=False,
        attn_implementation="eager",
    )
    return trace(transformers.LlamaForCausalLM(config), (torch.randint(0, 128, (BATCH, SEQ)),))


@pytest.fixture(scope="module")
def graphs():
    with pytest.MonkeyPatch.context() as mp:
        for name, value in GPTM.items():
            mp.setenv(f"AUTOPLAN_GPTM_{name}", str(value))
        gptm = trace_model_file(ROOT / "examples" / "gpt_megatron.py", BATCH)
    return {"llama_eager": _llama_eager(), "gpt_megatron": gptm}


@pytest.fixture(scope="module")
def h100():
    return load_profile("dgx-h100")


@pytest.fixture(scope="module")
def searches(graphs, h100):
    """Every (graph, runtime) searched once on 4 H100s, keeping every candidate priced."""
    found = {}
    for name, graph in graphs.items():
        for runtime in RUNTIMES:
            search = Search(graph, h100, SearchOptions(devices=4, batch_size=BATCH, keep=10**6, runtime=runtime))
            found[name, runtime] = search.run()
    return found


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", ["llama_eager", "gpt_megatron"])
def test_bounds_stay_below_every_plan_priced_for_the_runtime(searches, graphs, h100, name, runtime):
    result = searches[name, runtime]
    priced = [c for c in result.candidates if c.cost is not None and c.status == "evaluated"]
    if name == "gpt_megatron":  # its tp > 1 bounds exceed by ~0.1% under runtime autoplan too: not this rule
        priced = [c for c in priced if c.plan.tp == 1]
    assert len(priced) > 10
    assert all(c.lower_bound <= c.objective * (1 + 1e-9) for c in priced)
    # the search's price is the public estimate's for the plan's runtime (its attention fused)
    model = CostModel(graphs[name], h100)
    assert model.for_runtime(runtime) is not model
    for c in priced[:5]:
        assert c.plan.runtime == runtime
        assert c.cost.step_time_s == pytest.approx(model.estimate(c.plan).step_time_s, rel=1e-12)


FUSED_REGIONS = pytest.mark.xfail(
    strict=True,
    reason="ops.csv prices each block's own fused regions, CostModel the first block's for the group "
    "(cost/compute/fusion.py: depths run across blocks, and Llama's first block reads the rotary tables "
    "and mask), so under Megatron's fused element-wise ops they differ by 0.5%",
)


@pytest.mark.parametrize(
    "name, runtime",
    [
        pytest.param("llama_eager", "megatron", marks=FUSED_REGIONS),
        ("llama_eager", "torchtitan"),
        ("gpt_megatron", "megatron"),
        ("gpt_megatron", "torchtitan"),
    ],
)
def test_ops_and_stages_csv_sum_to_the_runtimes_price(searches, graphs, h100, name, runtime):
    graph, model = graphs[name], CostModel(graphs[name], h100)
    # pp = 1, no recomputation, no compiled regions or async TP: ops.csv prices one eager pass per op
    eager = [c.plan for c in searches[name, runtime].candidates if c.cost is not None and c.plan.pp == 1]
    priced = [p for p in eager if p.recompute == "none" and not (p.compile or p.tp_comm_overlap)]
    plans = priced[:2] + [p for p in priced if p.tp > 1][:2]  # tiny Llama's ILP splits nothing: tp = 1 only
    assert plans
    for plan in plans:
        cost = model.estimate(plan)
        rows = list(csv.DictReader(io.StringIO(ops_csv(graph, h100, plan))))
        m = plan.num_microbatches  # pp = 1: every op runs on the one stage, m times
        assert m * sum(float(r["compute_s"]) for r in rows) == pytest.approx(cost.compute_s, rel=1e-9)
        assert m * sum(float(r["comm_s"]) for r in rows) == pytest.approx(cost.tp_comm_s, rel=1e-9)
        assert any(r["kind"] == "attention" for r in rows)  # the fused kernel is one row
        (stage,) = csv.DictReader(io.StringIO(stages_csv(graph, h100, plan)))
        assert int(stage["memory_bytes"]) == pytest.approx(cost.peak_memory_bytes, abs=1)


def test_plan_for_megatron_from_the_cli_is_what_explain_reprices(tmp_path, monkeypatch):
    for name, value in GPTM.items():
        monkeypatch.setenv(f"AUTOPLAN_GPTM_{name}", str(value))
    out = tmp_path / "plan"
    args = ["plan", str(ROOT / "examples" / "gpt_megatron.py"), "--devices", "4", "--profile", "dgx-h100"]
    assert main([*args, "--batch", str(BATCH), "--runtime", "megatron", "--out", str(out), "--quiet"]) == 0
    plan = Plan.load(out / "plan.json")
    assert plan.runtime == "megatron"
    again = explain(out, rivals=1, sensitivity=False)
    assert again.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-12)
    graph = trace_model_file(ROOT / "examples" / "gpt_megatron.py", BATCH)
    priced = CostModel(graph, load_profile("dgx-h100")).estimate(plan)
    assert priced.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-12)
    rows = list(csv.DictReader((out / "ops.csv").open()))
    m = plan.num_microbatches if plan.pp == 1 else None
    if m is not None:
        assert m * sum(float(r["compute_s"]) for r in rows) == pytest.approx(priced.compute_s, rel=1e-9)
    assert json.loads((out / "plan.json").read_text())["runtime"] == "megatron"


def test_sweep_prices_every_point_for_its_runtime(tmp_path, monkeypatch):
    for name, value in GPTM.items():
        monkeypatch.setenv(f"AUTOPLAN_GPTM_{name}", str(value))
    args = ["sweep", str(ROOT / "examples" / "gpt_megatron.py"), "--devices", "8", "--profile", "aws-p5"]
    out = tmp_path / "sweep"
    assert main([*args, "--batch", str(BATCH), "--steps", "100", "--runtime", "megatron", "--out", str(out)]) == 0
    plan = Plan.load(out / "plan.json")
    assert plan.runtime == "megatron"
    graph = trace_model_file(ROOT / "examples" / "gpt_megatron.py", BATCH)
    priced = CostModel(graph, load_profile(out / "profile.json")).estimate(plan)
    assert priced.step_time_s == pytest.approx(plan.predicted.step_time_s, rel=1e-12)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_no_fit_suggestion_is_a_plan_for_the_runtime(graphs, h100, runtime):
    """The plan a no-fit message suggests (solve/api.py) is priced, and fits, under the search's runtime."""
    from autoplan.solve.api import smallest_fitting_devices

    options = SearchOptions(devices=2, batch_size=BATCH, runtime=runtime)
    suggested = smallest_fitting_devices(graphs["gpt_megatron"], h100, options)
    assert suggested is not None and suggested.runtime == runtime
    assert CostModel(graphs["gpt_megatron"], h100).estimate(suggested).feasible


def test_a_runtime_without_fp8_is_searched_and_pinned_without_it(graphs, h100):
    """DeepSpeed and the papers' Megatron-LM run no FP8 recipe autoplan prices: --allow-fp8 leaves fp8 out of
    their search, a precision=fp8 pin is one sentence, and so is such a plan."""
    from autoplan.errors import PlanError
    from autoplan.solve.api import plan_graph

    result = plan_graph(
        graphs["gpt_megatron"], devices=4, profile=h100, batch_size=BATCH, runtime="deepspeed", allow_fp8=True
    )
    assert result.best.precision != "fp8" and result.best.runtime == "deepspeed"
    with pytest.raises(PlanError, match="runs no FP8 recipe"):
        plan_graph(
            graphs["gpt_megatron"],
            devices=4,
            profile=h100,
            batch_size=BATCH,
            runtime="deepspeed",
            fix={"precision": "fp8"},
        )
    with pytest.raises(PlanError, match="runs no FP8 recipe"):
        Plan(
            devices=4,
            dp=4,
            tp=1,
            pp=1,
            micro_batch_size=1,
            num_microbatches=1,
            precision="fp8",
            runtime="megatron-lm-2022",
        )
