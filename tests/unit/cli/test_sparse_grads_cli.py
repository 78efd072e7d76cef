"""`autoplan run` refuses, in one sentence and before any rank starts, a plan that cannot run the
model's sparse embedding gradients (a hand-edited ZeRO-1 plan); the planner itself offers only DDP."""

import json
from pathlib import Path

import pytest

from autoplan.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[3] / "examples" / "sparse_embedding.py")


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sparse_plan")
    assert (
        main(["plan", EXAMPLE, "--devices", "2", "--batch", "8", "--profile", "cpu-gloo", "--quiet", "--out", str(out)])
        == 0
    )
    return out


def test_the_planner_picks_ddp(plan_dir):
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert (plan["dp"], plan["tp"], plan["pp"], plan["zero_stage"]) == (2, 1, 1, 0)


def test_a_zero1_plan_is_refused_before_any_rank_starts(plan_dir, tmp_path, capsys):
    plan = json.loads((plan_dir / "plan.json").read_text())
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps({**plan, "zero_stage": 1}))
    assert main(["run", EXAMPLE, "--plan", str(edited), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "autoplan: error: tokens.weight, categories.weight take sparse gradients"
    )
    assert "zero_stage=1" in err[0]
    assert not (tmp_path / "run").exists()
