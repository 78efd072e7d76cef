"""A plan is priced for the runtime that will run it: ``plan --runtime``, ``export`` printing the
target's step beside autoplan's, ``explain --config`` pricing a config for its framework, and
``run``/``launch``/``parallelize`` refusing a plan priced for another runtime (docs/export.md)."""

import json
from pathlib import Path

import pytest
from synthetic import synthetic_gpt, synthetic_profile

from autoplan.cli import main
from autoplan.cost import CostModel
from autoplan.errors import PlanError
from autoplan.export.api import price_config
from autoplan.solve.api import plan_graph
from autoplan.solve.outputs import write_outputs

GPT = str(Path(__file__).resolve().parents[3] / "examples" / "gpt.py")


@pytest.fixture(scope="module")
def graph_profile():
    return synthetic_gpt(layers=4, hidden=256, heads=8, vocab=8000, seq=128, batch=32), synthetic_profile()


@pytest.fixture(scope="module")
def folder(tmp_path_factory, graph_profile):
    """An autoplan plan with several micro-batches (so accumulation is priced) in a plan folder."""
    graph, profile = graph_profile
    fix = {"tp": 2, "pp": 2, "mbs": 1}
    result = plan_graph(graph, devices=16, profile=profile, batch_size=32, fix=fix)
    out = tmp_path_factory.mktemp("plan")
    write_outputs(out, result=result, graph=graph, profile=profile)
    return out, result.best


def test_plan_for_a_runtime_prices_every_plan_for_it(graph_profile):
    graph, profile = graph_profile
    fix = {"tp": 2, "pp": 2, "mbs": 1}
    result = plan_graph(graph, devices=16, profile=profile, batch_size=32, fix=fix, runtime="megatron")
    assert result.best.runtime == "megatron"
    assert result.best_cost.step_time_s == pytest.approx(CostModel(graph, profile).estimate(result.best).step_time_s)
    assert result.best_cost.grad_accum_s == 0.0  # --gradient-accumulation-fusion
    with pytest.raises(PlanError, match="runtime='nemo'"):
        plan_graph(graph, devices=16, profile=profile, batch_size=32, fix=fix, runtime="nemo")


def test_export_prints_the_targets_step_beside_autoplans(folder, tmp_path, capsys):
    out, best = folder
    assert main(["--json", "export", str(out), "--to", "megatron", "--out", str(tmp_path) + "/"]) == 0
    predicted = json.loads(capsys.readouterr().out)["predicted"]
    assert predicted["runtime"] == "megatron"
    assert best.predicted.step_time_s == pytest.approx(predicted["autoplan_step_s"])
    assert predicted["runtime_step_s"] < predicted["autoplan_step_s"]  # no accumulation passes under Megatron
    assert main(["export", str(out), "--to", "deepspeed", "--out", str(tmp_path) + "/"]) == 0
    assert "under deepspeed" in capsys.readouterr().out
    assert main(["--json", "export", str(out), "--to", "accelerate", "--out", str(tmp_path) + "/"]) == 0
    # Accelerate has no preset: FSDP or DeepSpeed run under the user's own script
    assert "predicted" not in json.loads(capsys.readouterr().out)


def test_explain_config_prices_a_megatron_config_as_megatron_runs_it(folder, tmp_path, capsys, graph_profile):
    out, best = folder
    graph, profile = graph_profile
    assert main(["--quiet", "export", str(out), "--to", "megatron", "--out", str(tmp_path) + "/"]) == 0
    priced = price_config(
        tmp_path / "megatron_args.txt", graph=graph, profile=profile, devices=16, batch_size=best.global_batch_size
    )
    assert priced.config_plan.runtime == "megatron" and priced.best_plan.runtime == "megatron"
    assert priced.slower >= 1 - 1e-9


@pytest.mark.parametrize("runtime", ["megatron", "megatron-lm-2022", "torchtitan"])
def test_run_launch_and_parallelize_refuse_a_plan_priced_for_another_runtime(folder, tmp_path, capsys, runtime):
    from dataclasses import replace

    from autoplan.execute.api import parallelize

    _, best = folder
    plan = replace(best, runtime=runtime, predicted=None)
    path = plan.save(tmp_path / "plan.json")
    target = "torchtitan" if runtime == "torchtitan" else "megatron"
    for argv in (
        ["run", GPT, "--plan", str(path), "--out", str(tmp_path / "run")],
        ["launch", GPT, str(path), "--slurm"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"priced for {runtime}; export it with `autoplan export --to {target}`" in err
        assert err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(PlanError, match=f"priced for {runtime}"):
        parallelize(None, plan, loss_fn=None)


def test_explaining_a_plan_folder_searches_again_for_its_runtime(graph_profile, tmp_path):
    from autoplan.report.folder import load_plan_folder, search_again

    graph, profile = graph_profile
    fix = {"tp": 2, "pp": 2, "mbs": 1}
    result = plan_graph(graph, devices=16, profile=profile, batch_size=32, fix=fix, runtime="megatron")
    write_outputs(tmp_path, result=result, graph=graph, profile=profile)
    again = search_again(load_plan_folder(tmp_path))
    assert again.best.runtime == "megatron"
    assert again.best_cost.step_time_s == pytest.approx(result.best_cost.step_time_s)
