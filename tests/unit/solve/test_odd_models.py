"""Every model plans: blocks are an optimisation the tracer finds, never a requirement; a model
without repeated blocks pipelines at the boundaries between its top-level modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.errors import PlanError
from autoplan.profile import load_profile
from autoplan.solve.api import plan_graph
from autoplan.solve.notes import plan_notes
from autoplan.solve.pipeline import partition_brute_force
from autoplan.solve.stage_costs import StageCosts
from autoplan.trace import trace_model_file
from autoplan.types.plan import Plan

ODD = Path(__file__).resolve().parents[2] / "odd_models"
ROOT = ODD.parents[1]
#: model file -> the blocks the tracer must find (a pipeline places these on stages)
BLOCKS = {
    "two_modules": ["a", "b"],  # no repeated container: the top-level modules
    "unlike_modules": ["embed", "rnn", "head"],  # in the order forward() calls them, not registers them
    "one_block": ["inp", "blocks", "out"],  # a list of one block is not repeated: the top-level modules
    "mixed_blocks": [f"body.{i}" for i in range(8)],  # blocks and width-changing projections
    "nested": ["groups.low.0", "groups.low.1", "groups.high.0", "groups.high.1"],
    "shared_module": [],  # its children interleave over three calls, and it is called three times
    "one_linear": [],  # no child module at all
    "side_effects": [f"layers.{i}" for i in range(4)],
    "loop_moe": ["layers.0", "layers.1"],  # blocks, but an MoE loop no pipeline split can export
    "loose_ends": [f"blocks.{i}" for i in range(4)],
    "frozen_stem": [f"blocks.{i}" for i in range(4)],
    "torch_transformer": ["transformer_encoder.layers.0", "transformer_encoder.layers.1"],
    "torch_seq2seq": [f"transformer.{part}.layers.{i}" for part in ("encoder", "decoder") for i in range(2)],
}
#: models with blocks that the planner still refuses to pipeline: torch.export cannot split them
UNSPLITTABLE = {"loop_moe"}
#: models with an op DTensor has no strategy for (nn.LSTM's aten.mkldnn_rnn_layer): no tp > 1
NO_DTENSOR = {"unlike_modules"}


@pytest.fixture(scope="module")
def graphs():
    return {name: trace_model_file(ODD / f"{name}.py", 8) for name in BLOCKS}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_tracer_finds_exactly_the_blocks_a_pipeline_can_cut(graphs, name):
    assert graphs[name].layers == BLOCKS[name]


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("fix", ["", "dp=2", "tp=2", "dp=2,zero=3"])
def test_every_odd_model_plans_and_its_stages_hold_every_block_once(graphs, name, fix):
    if "tp=2" in fix and name in NO_DTENSOR:
        with pytest.raises(PlanError, match="cannot run on this model: tensor parallelism runs every op on DTensors"):
            plan_graph(graphs[name], devices=2, profile="cpu-gloo", fix=fix)
        return
    result = plan_graph(graphs[name], devices=2, profile="cpu-gloo", fix=fix or None)
    plan = result.best
    assert plan.pp <= max(1, len(BLOCKS[name]))
    assert [b for stage in plan.stages for b in stage] == BLOCKS[name]
    assert result.best_cost.step_time_s > 0 and result.best_cost.peak_memory_bytes > 0
    if not BLOCKS[name]:
        assert plan.recompute == "none"  # recomputation checkpoints blocks


@pytest.mark.parametrize("name", sorted(n for n, b in BLOCKS.items() if len(b) >= 2 and n not in UNSPLITTABLE))
def test_models_with_blocks_can_pipeline(graphs, name):
    plan = plan_graph(graphs[name], devices=2, profile="cpu-gloo", fix="pp=2").best
    assert plan.pp == 2 and all(plan.stages) and sum(plan.stages, []) == BLOCKS[name]


def test_unlike_modules_are_partitioned_at_the_optimum_of_what_the_cost_model_charges(graphs):
    graph = graphs["unlike_modules"]
    plan = plan_graph(graph, devices=2, profile="cpu-gloo", fix="pp=2,precision=fp32").best
    problem = StageCosts(graph, load_profile("cpu-gloo")).problem(plan)
    best = partition_brute_force(problem)
    assert [len(stage) for stage in plan.stages] == [j - i for i, j in zip(best.bounds, best.bounds[1:])]
    assert len(set(problem.cut_s[1:-1])) == 2  # the embedding's output and the LSTM's differ in size


@pytest.mark.parametrize(
    "fix, says", [("pp=2", "needs at least 2 blocks .* top-level modules"), ("recompute=full", "this model has none")]
)
def test_asking_a_blockless_model_for_what_needs_blocks_is_one_clear_sentence(graphs, fix, says):
    with pytest.raises(PlanError, match=says):
        plan_graph(graphs["shared_module"], devices=2, profile="cpu-gloo", fix=fix)


@pytest.mark.parametrize("fix", ["pp=2,schedule=interleaved_1f1b", "pp=2,v=2", "pp=2,schedule=dualpipev"])
def test_a_looped_schedule_on_too_few_blocks_says_so(graphs, fix):
    """two_modules has 2 blocks, and a looped schedule at pp = 2 runs 4 chunks of them: 'relax a pin' hid it."""
    with pytest.raises(PlanError, match="runs 4 chunks of whole blocks .* this model has 2 blocks"):
        plan_graph(graphs["two_modules"], devices=2, profile="cpu-gloo", fix=fix)


def test_a_tp_degree_that_splits_nothing_is_pruned_unless_pinned(graphs):
    result = plan_graph(graphs["two_modules"], devices=2, profile="cpu-gloo", top_k=5)
    assert result.best.tp == 1
    assert all(c.plan.tp == 1 for c in result.ranked())
    assert any("splits no op" in c.reason for c in result.candidates if c.status == "pruned")
    pinned = plan_graph(graphs["two_modules"], devices=2, profile="cpu-gloo", fix="tp=2")
    assert pinned.best.tp == 2
    notes = plan_notes(pinned, load_profile("cpu-gloo"))  # the warning `autoplan plan` prints
    assert any("tp=2 splits no op of this model" in note for note in notes)
    assert not any("splits no op" in note for note in plan_notes(result, load_profile("cpu-gloo")))


def test_resnet_on_eight_gpus_uses_them_for_data_not_replicated_tp():
    graph = trace_model_file(ROOT / "examples/resnet.py", 16)
    result = plan_graph(graph, devices=8, profile="dgx-a100", top_k=3)
    assert all(c.plan.tp == 1 for c in result.ranked()[:3])
    assert result.best.dp > 1


def test_the_command_line_pipelines_two_modules_and_refuses_a_reused_one_in_one_sentence(tmp_path, capsys):
    args = ["--devices", "2", "--profile", "cpu-gloo", "--batch", "8", "--fix", "pp=2", "--quiet"]
    assert main(["plan", str(ODD / "two_modules.py"), *args, "--out", str(tmp_path / "two")]) == 0
    assert Plan.load(tmp_path / "two" / "plan.json").stages == [["a"], ["b"]]
    capsys.readouterr()
    assert main(["plan", str(ODD / "shared_module.py"), *args, "--out", str(tmp_path / "shared")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("autoplan: warning:")]
    assert len(errors) == 1 and "forward() calls once each" in errors[0] and "Traceback" not in errors[0]


def test_the_command_line_plans_a_model_without_blocks_and_writes_its_one_stage(tmp_path):
    args = ["--devices", "2", "--profile", "cpu-gloo", "--batch", "8", "--quiet", "--out", str(tmp_path)]
    assert main(["plan", str(ODD / "one_linear.py"), *args]) == 0
    stages = (tmp_path / "stages.csv").read_text().splitlines()
    assert len(stages) == 2 and stages[1].startswith("0,0,")  # a header and stage 0, holding no block


def test_interleaving_blocks_no_pp_x_v_divides_says_so():
    """Five blocks at pp = 2: interleaved 1F1B needs equal chunks of whole blocks (pp x v divides the blocks)."""
    from types import SimpleNamespace

    from autoplan.solve.empty_space import no_configuration

    for fixes in ({"pp": 2, "schedule": "interleaved_1f1b"}, {"pp": 2, "v": 2}):
        said = no_configuration(SimpleNamespace(fixes=fixes, devices=2, batch_size=8), 5)
        assert "no v makes pp x v divide this model's 5 blocks" in said
    assert "no v makes" not in no_configuration(
        SimpleNamespace(fixes={"pp": 2, "schedule": "zbv"}, devices=2, batch_size=8), 5
    )


@pytest.mark.parametrize(
    "schedule, rule",
    [("zbv", "needs at least 2 pp = 4 micro-batches a step"), ("interleaved_1f1b", "a step that pp = 2 divides")],
)
def test_a_schedule_that_runs_no_micro_batch_count_of_the_batch_says_so(graphs, schedule, rule):
    """Batch 3 on 2 devices at pp = 2 gives 1 or 3 micro-batches a step: neither a V schedule (at least 2 pp) nor
    interleaved 1F1B (a multiple of pp) runs them, where the sentence named the device and batch rules, which hold."""
    with pytest.raises(PlanError) as refused:
        plan_graph(graphs["side_effects"], devices=2, profile="cpu-gloo", batch_size=3, fix=f"pp=2,schedule={schedule}")
    assert rule in str(refused.value) and "and batch 3 on 2 devices gives 1 or 3;" in str(refused.value)


def test_a_model_built_in_bf16_is_planned_in_bf16_and_an_fp32_pin_is_one_sentence():
    graph = trace_model_file(ODD / "built_in_bf16.py", 8)
    assert {c.plan.precision for c in plan_graph(graph, devices=2, profile="cpu-gloo").candidates if c.plan} == {"bf16"}
    with pytest.raises(PlanError, match="the model's parameters are all bf16 .* pin precision=bf16"):
        plan_graph(graph, devices=2, profile="cpu-gloo", fix="precision=fp32")
