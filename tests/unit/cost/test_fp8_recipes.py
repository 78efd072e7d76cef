"""FP8 recipes (autoplan/cost/compute/fp8.py): the bytes each recipe's casts move, rowwise's slower
GEMM, Transformer Engine's once-a-step weight cast priced for Megatron plans, the refusals, and the
Megatron-LM flags and the sentence that name the recipe."""

import json
from pathlib import Path

import pytest

from autoplan.cost import CostModel
from autoplan.cost.compute.fp8 import ROWWISE_GEMM_EFFICIENCY, Fp8Recipe, fp8_cast_bytes
from autoplan.cost.compute.roofline import memory_time_s, op_time_s
from autoplan.errors import PlanError
from autoplan.export import megatron
from autoplan.export.common import ModelFacts
from autoplan.profile import load_profile
from autoplan.report.fp8 import te_saving
from autoplan.trace import trace_model_file
from autoplan.types import Plan
from autoplan.types.graph import OpNode

ROOT = Path(__file__).resolve().parents[3]
M, K, N = 8192, 4096, 2048


@pytest.fixture(scope="module")
def h100():
    return load_profile("dgx-h100")


@pytest.fixture(scope="module")
def gpt_graph():
    """examples/gpt.py at width 1024, 2048 tokens: linears large enough for FP8, traced on meta."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in dict(N_LAYER=2, N_EMBD=1024, N_HEAD=8, BLOCK_SIZE=2048, VOCAB_SIZE=32000).items():
            mp.setenv(f"AUTOPLAN_GPT_{name}", str(value))
        return trace_model_file(ROOT / "examples" / "gpt.py", 2)


def _linear() -> OpNode:
    return OpNode(
        name="fc",
        op="linear",
        target="Linear",
        module="fc",
        layer=None,
        param_count=K * N,
        param_bytes=K * N * 2,
        output_shape=[1, M, N],
        output_dtype="torch.bfloat16",
        output_bytes=2 * M * N,
        saved_bytes=2 * M * K,
        fwd_flops=2 * M * K * N,
        bwd_flops=4 * M * K * N,
        attrs={"in_features": K, "out_features": N, "bias": False},
    )


def _plan(**kw) -> Plan:
    fields = dict(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, precision="fp8")
    return Plan(**{**fields, **kw})


# ---- bytes per recipe ----------------------------------------------------------------------------
def test_each_recipe_moves_the_bytes_its_table_row_states():
    x, w, g = float(M * K), float(K * N), float(M * N)
    node = _linear()

    def moved(name, backward, m=1):
        return fp8_cast_bytes(node, batch_fraction=1.0, backward=backward, recipe=Fp8Recipe(name, m))

    assert moved("tensorwise", False) == 5 * (x + w)
    assert moved("tensorwise", True) == 5 * (2 * g + w + x) + 2 * (w + g + x)
    assert moved("rowwise", False) == 5 * (x + w) + 4 * (M + N)  # one fp32 scale per row
    assert moved("rowwise", True) == moved("tensorwise", True) + 4 * (M + N + 2 * K)
    # TE: casts fused into the producing kernel, weights cast once a step over its 4 micro-batches
    assert moved("te_delayed", False, 4) == 1 * x + 4 * w / 4 and moved("te_delayed", True, 4) == 4 * g
    assert moved("te_current", False, 4) == 3 * x + 6 * w / 4 and moved("te_current", True, 4) == 6 * g


def test_a_recipe_is_named_or_refused():
    assert Fp8Recipe.of(recipe="", num_microbatches=8) == Fp8Recipe("tensorwise", 1)
    assert Fp8Recipe.of(recipe="te_delayed", num_microbatches=8) == Fp8Recipe("te_delayed", 8)
    with pytest.raises(ValueError, match="fp8 recipe 'mxfp8'; expected one of tensorwise, rowwise"):
        Fp8Recipe.of(recipe="mxfp8", num_microbatches=1)


def test_rowwise_runs_its_gemm_slower_than_tensorwise(h100):
    node, kw = _linear(), dict(precision="fp8", batch_fraction=1.0)
    tensorwise = op_time_s(node, h100, **kw)
    rowwise = op_time_s(node, h100, recipe=Fp8Recipe("rowwise"), **kw)
    casts = memory_time_s(h100, fp8_cast_bytes(node, batch_fraction=1.0, backward=False))
    scales = memory_time_s(h100, 4 * (M + N))
    assert rowwise - casts - scales == pytest.approx((tensorwise - casts) / ROWWISE_GEMM_EFFICIENCY)


# ---- a plan ----------------------------------------------------------------------------------------
def test_a_megatron_plan_prices_transformer_engines_recipe(gpt_graph, h100):
    model = CostModel(gpt_graph, h100)
    delayed = _plan(runtime="megatron", fp8_recipe="te_delayed")
    te = model.estimate(delayed).compute_s
    torchao = model.estimate(delayed, fp8_recipe="tensorwise").compute_s
    current = model.estimate(_plan(runtime="megatron", fp8_recipe="te_current")).compute_s
    assert te < current < torchao
    # autoplan's default is tensorwise: priced as the recipe named
    default = model.estimate(_plan()).compute_s
    assert default == pytest.approx(model.estimate(_plan(fp8_recipe="tensorwise")).compute_s)
    assert _plan().fp8_recipe_used == "tensorwise"
    rowwise = model.estimate(_plan(fp8_recipe="rowwise")).compute_s
    assert rowwise > torchao
    # the weight's once-a-step cast is shared by the step's micro-batches
    per_batch = [model.estimate(_plan(runtime="megatron", fp8_recipe="te_delayed", num_microbatches=m)) for m in (1, 8)]
    assert per_batch[1].compute_s / 8 < per_batch[0].compute_s


def test_te_saving_names_the_recipe_and_the_seconds(gpt_graph, h100):
    line = te_saving(_plan(runtime="megatron", fp8_recipe="te_delayed"), graph=gpt_graph, profile=h100)
    assert line.startswith("Transformer Engine's fused casts (delayed scaling) save ")
    assert "per step over torchao tensorwise" in line
    exported = te_saving(_plan(), graph=gpt_graph, profile=h100)  # an autoplan plan, as Megatron would run it
    assert "(current scaling)" in exported
    assert te_saving(_plan(precision="bf16"), graph=gpt_graph, profile=h100) == ""


def test_recipes_a_runtime_does_not_run_are_refused():
    with pytest.raises(PlanError, match="fp8_recipe='te_delayed' with runtime 'autoplan'"):
        _plan(fp8_recipe="te_delayed")
    with pytest.raises(PlanError, match="fp8_recipe='rowwise' with runtime 'megatron'"):
        _plan(runtime="megatron", fp8_recipe="rowwise")


def test_the_executor_refuses_rowwise_under_tensor_parallelism(monkeypatch):
    from autoplan.execute.float8 import EMULATE_ENV, check_runs_here

    monkeypatch.setenv(EMULATE_ENV, "1")
    check_runs_here(_plan(fp8_recipe="rowwise"))  # dp only: runs (emulated here)
    with pytest.raises(PlanError, match=r"fp8_recipe=rowwise with tp=2: torchao's float8 tensor-parallel"):
        check_runs_here(_plan(dp=1, tp=2, fp8_recipe="rowwise"))


# ---- Megatron-LM's flags ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("runtime", "recipe", "flag"),
    [("megatron", "te_delayed", "delayed"), ("megatron", "te_current", "tensorwise"), ("autoplan", "", "tensorwise")],
)
def test_megatron_export_names_the_recipe_and_reads_it_back(runtime, recipe, flag):
    plan = _plan(runtime=runtime, fp8_recipe=recipe)
    text = megatron.export(plan, ModelFacts()).text
    assert "--fp8-format hybrid" in text and f"--fp8-recipe {flag}" in text
    read = megatron.read(text, devices=2)
    assert read.fields["runtime"] == "megatron"
    assert read.fields["fp8_recipe"] == {"delayed": "te_delayed", "tensorwise": "te_current"}[flag]
    assert not [u for u in read.unmapped if "fp8" in u]


# ---- what the commands say -------------------------------------------------------------------------
def test_explain_config_and_export_say_what_te_saves(tmp_path, capsys, gpt_graph):
    """A Megatron fp8 config is priced with TE's delayed scaling (Megatron's default --fp8-recipe) and
    explain says what it saves; an fp8 plan folder exported to Megatron says the same for current scaling."""
    from autoplan.cli import main

    config = tmp_path / "args.txt"
    config.write_text(
        "--num-layers 2 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 --vocab-size 32000 "
        "--micro-batch-size 1 --global-batch-size 2 --bf16 --fp8-format hybrid"
    )
    model = {"AUTOPLAN_GPT_N_LAYER": "2", "AUTOPLAN_GPT_N_EMBD": "1024", "AUTOPLAN_GPT_N_HEAD": "8"}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**model, "AUTOPLAN_GPT_BLOCK_SIZE": "2048", "AUTOPLAN_GPT_VOCAB_SIZE": "32000"}.items():
            mp.setenv(name, value)
        argv = ["--json", "explain", "--config", str(config), "--model", str(ROOT / "examples" / "gpt.py")]
        assert main([*argv, "--profile", "dgx-h100", "--devices", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "recipe=te_delayed runtime=megatron" in result["config_plan"]
    assert result["fp8_recipe"].startswith("Transformer Engine's fused casts (delayed scaling) save ")
    folder = tmp_path / "plan"
    folder.mkdir()
    gpt_graph.save(folder / "graph.json")
    _plan(devices=1, dp=1, profile="dgx-h100").save(folder / "plan.json")
    assert main(["export", str(folder), "--to", "megatron", "--out", str(tmp_path / "megatron_args.txt")]) == 0
    out = capsys.readouterr().out
    assert "Transformer Engine's fused casts (current scaling) save " in out


# ---- FSDP2's FP8 all-gather -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "backend", "fp8_bytes"),
    [
        (dict(zero_stage=3), "nccl", 1),
        (dict(zero_stage=3), "gloo", 0),  # gloo has no float8 dtypes
        (dict(zero_stage=3, fp8_recipe="rowwise"), "nccl", 0),  # torchao offers it for tensorwise only
        (dict(zero_stage=3, precision="bf16"), "nccl", 0),
        (dict(zero_stage=1), "nccl", 0),
        (dict(zero_stage=3, runtime="torchtitan"), "nccl", 0),  # off by default there, and not exported
    ],
)
def test_the_dp_statement_gathers_fp8_weights_where_torchao_does(fields, backend, fp8_bytes):
    from autoplan.cost.dp.messages import WEIGHTS, dp_messages

    weights = [m for m in dp_messages(_plan(**fields), backend=backend) if m.payload == WEIGHTS]
    assert weights and {m.fp8_bytes_per_param for m in weights} == {fp8_bytes}
    size = weights[0].bytes_per_param
    assert weights[0].unit_bytes(100.0, 60.0) == (40 * size + 60 * fp8_bytes if fp8_bytes else 100 * size)


def test_the_audit_predicts_fp8_gathers_of_the_fp8_linears_weights(gpt_graph, h100):
    """Under ZeRO-3 on NCCL each gather of a unit sends its FP8 linears' weights in 1 byte: the
    step's all-gathered bytes fall by one byte per FP8 weight per gather, against rowwise's."""
    from autoplan.cost.compute.fp8 import fp8_linear
    from autoplan.cost.volumes import predict

    model = CostModel(gpt_graph, h100)
    plans = {r: _plan(zero_stage=3, num_microbatches=2, fp8_recipe=r) for r in ("tensorwise", "rowwise")}
    gathered = {r: predict(model, p)[0].comm["dp", "all_gather"] for r, p in plans.items()}
    weights = sum(
        n.attrs["in_features"] * n.attrs["out_features"] for n in gpt_graph.nodes if fp8_linear(n, precision="fp8")
    )
    gathers = 2 + 2  # each micro-batch's forward and backward
    assert gathered["tensorwise"][0] == gathered["rowwise"][0]  # the same calls
    assert gathered["rowwise"][1] - gathered["tensorwise"][1] == pytest.approx(gathers * weights)
    assert model.estimate(plans["tensorwise"]).zero_comm_s < model.estimate(plans["rowwise"]).zero_comm_s


def test_the_executor_enables_torchaos_fp8_all_gather_by_the_same_rule():
    from autoplan.execute.float8 import float8_config, fsdp_gather

    assert float8_config("tensorwise", fsdp_gather=True).enable_fsdp_float8_all_gather
    assert not float8_config("tensorwise").enable_fsdp_float8_all_gather
    assert not fsdp_gather(_plan(zero_stage=3))  # this CPU machine runs gloo
