"""`autoplan plan --tokens/--steps/--spot/--deadline/--budget` and `autoplan sweep` from the
command line: the whole-run line and plan.json's predicted.run, sweep.csv, pareto.png and the
one-sentence recommendation, and one-sentence errors with exit 2."""

import csv
import json
from pathlib import Path

import pytest

from autoplan.cli import main
from autoplan.cli.whole_run import DOLLAR_SUFFIXES, HOUR_SUFFIXES, TOKEN_SUFFIXES, quantity
from autoplan.errors import PlanError
from autoplan.types.plan import Plan

GPT = str(Path(__file__).resolve().parents[3] / "examples" / "gpt.py")


@pytest.fixture
def small_gpt(monkeypatch):
    for field, value in (
        ("N_LAYER", "2"),
        ("N_EMBD", "128"),
        ("N_HEAD", "4"),
        ("VOCAB_SIZE", "1024"),
        ("BLOCK_SIZE", "64"),
    ):
        monkeypatch.setenv(f"AUTOPLAN_GPT_{field}", value)
    return GPT


def _plan(model, out, *extra):
    return main(["plan", model, "--devices", "8", "--batch", "16", "--out", str(out), *extra])


def _rows(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_quantities_take_the_suffixes_people_write():
    assert quantity("15T", flag="--tokens", suffixes=TOKEN_SUFFIXES, example="") == 15e12
    assert quantity("2e12", flag="--tokens", suffixes=TOKEN_SUFFIXES, example="") == 2e12
    assert quantity("3d", flag="--deadline", suffixes=HOUR_SUFFIXES, example="") == 72.0
    assert quantity("90min", flag="--deadline", suffixes=HOUR_SUFFIXES, example="") == 1.5
    assert quantity("$40k", flag="--budget", suffixes=DOLLAR_SUFFIXES, example="") == 40_000.0
    assert quantity("52,300", flag="--budget", suffixes=DOLLAR_SUFFIXES, example="") == 52_300.0
    with pytest.raises(PlanError, match="--deadline '3x' is not valid"):
        quantity("3x", flag="--deadline", suffixes=HOUR_SUFFIXES, example="72h")


def test_plan_reports_the_whole_run(small_gpt, tmp_path, capsys):
    assert _plan(small_gpt, tmp_path, "--profile", "aws-p4d", "--tokens", "1e9") == 0
    out = capsys.readouterr().out
    assert "whole run: " in out and "device-hours" in out and "on-demand at $2.745/device-h" in out
    run = Plan.load(tmp_path / "plan.json").predicted.run
    assert run.steps == -(-(10**9) // (16 * 64)) and run.tokens_per_step == 16 * 64
    assert run.cost_usd == pytest.approx(run.billed_devices * run.expected_wall_h * 2.74470525)
    assert 0 < run.goodput <= 1 and run.goodput_note == ""  # aws-p4d has storage and reliability
    plans = _rows(tmp_path / "plans.csv")
    assert float(plans[0]["cost_usd"]) == pytest.approx(run.cost_usd)
    assert float(plans[0]["wall_h"]) == pytest.approx(run.expected_wall_h)


def test_plan_on_spot_with_a_price_override(small_gpt, tmp_path, capsys):
    args = ["--profile", "gcp-a3-high", "--steps", "100000", "--spot", "--spot-interruptions-per-device-hour", "1e-3"]
    assert _plan(small_gpt, tmp_path, *args, "--price-per-device-hour", "10", "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    run = printed["plan"]["predicted"]["run"]
    assert run["price_per_device_hour"] == 10.0 and run["spot_price_per_device_hour"] == pytest.approx(4.4244625)
    assert run["spot_goodput"] < run["goodput"] and run["spot_wall_h"] > run["expected_wall_h"]
    assert run["spot_cost_usd"] == pytest.approx(8 * run["spot_wall_h"] * 4.4244625)
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["pricing"]["on_demand_per_device_hour"] == 10.0  # the override is recorded


@pytest.mark.parametrize(
    "args, words",
    [
        (["--profile", "dgx-a100", "--objective", "cost"], "--price-per-device-hour"),
        (["--profile", "dgx-a100", "--tokens", "1e9", "--budget", "100"], "--budget needs a price"),
        (["--profile", "aws-p4d", "--tokens", "1e9", "--price-per-device-hour", "-1"], "--price-per-device-hour -1"),
        (["--profile", "aws-p4d", "--tokens", "1e9", "--spot"], "--spot-price-per-device-hour"),
        (["--profile", "aws-p4d", "--deadline", "3d"], "--tokens N or --steps N"),
        (["--profile", "aws-p4d", "--tokens", "1e9", "--deadline", "3x"], "--deadline '3x' is not valid"),
        (["--profile", "aws-p4d", "--tokens", "1e12", "--deadline", "1min"], "deadline: the fastest"),
        (["--profile", "aws-p4d", "--tokens", "1e9", "--budget", "$0.01"], r"raise --budget to \$"),
    ],
)
def test_bad_whole_run_input_is_one_sentence_and_exit_2(small_gpt, tmp_path, capsys, args, words):
    assert _plan(small_gpt, tmp_path, *args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autoplan: error: ") and "\n" not in err
    assert pytest.importorskip("re").search(words, err), err


def test_tokens_and_steps_are_exclusive(small_gpt, tmp_path):
    with pytest.raises(SystemExit) as exc:
        _plan(small_gpt, tmp_path, "--profile", "aws-p4d", "--tokens", "1e9", "--steps", "10")
    assert exc.value.code == 2


def test_sweep_writes_the_front_and_recommends_one_rental(small_gpt, tmp_path, capsys):
    args = ["sweep", small_gpt, "--devices", "1..16", "--profile", "aws-p4d,p5", "--batch", "16"]
    assert main([*args, "--tokens", "1e9", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Pareto front" in out and "Rent " in out and "the cheapest within 1.25x of the fastest" in out
    rows = _rows(tmp_path / "sweep.csv")
    assert {(r["profile"], int(r["devices"])) for r in rows} == {
        (p, n) for p in ("aws-p4d", "aws-p5") for n in (1, 2, 4, 8, 16)
    }
    assert sum(r["recommended"] == "True" for r in rows) == 1 and any(r["pareto"] == "True" for r in rows)
    assert (tmp_path / "pareto.png").stat().st_size > 10_000
    assert Plan.load(tmp_path / "plan.json").devices in (1, 2, 4, 8, 16)


def test_sweep_json_and_its_errors(small_gpt, tmp_path, capsys):
    args = ["sweep", small_gpt, "--devices", "8,16", "--profile", "aws-p5", "--batch", "16", "--out", str(tmp_path)]
    assert main([*args, "--steps", "1000", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["recommendation"].startswith("Rent ") and printed["grid_size"] == 2
    assert printed["recommended"]["run"]["steps"] == 1000
    assert main([*args[:5], "aws-p5,p9", *args[6:], "--steps", "1000"]) == 2
    assert "unknown profile or instance 'p9'" in capsys.readouterr().err
    assert main(args) == 2
    assert "pass --tokens N or --steps N" in capsys.readouterr().err
    assert main([*args, "--tokens", "1e12", "--deadline", "1min"]) == 2
    err = capsys.readouterr().err
    assert "no swept cluster meets the 1 min deadline: the fastest" in err and "relax --deadline" in err


def test_sweep_allow_lossy_reaches_every_point(small_gpt, tmp_path, capsys):
    args = ["sweep", small_gpt, "--devices", "16,32", "--profile", "aws-p3", "--batch", "64", "--steps", "1000"]
    assert main([*args, "--out", str(tmp_path / "exact"), "--quiet"]) == 0
    assert main([*args, "--out", str(tmp_path / "lossy"), "--allow-lossy", "--quiet"]) == 0
    exact, lossy = Plan.load(tmp_path / "exact" / "plan.json"), Plan.load(tmp_path / "lossy" / "plan.json")
    assert exact.lossy == [] and lossy.lossy  # 25 Gbit/s Ethernet: compression pays
    assert lossy.predicted.step_time_s < exact.predicted.step_time_s
