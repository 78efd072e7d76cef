"""autoplan report: the tables' contents, every figure written and not blank, report.md, and the CLI."""

from __future__ import annotations

import json
import re

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from synthetic import synthetic_gpt, synthetic_profile
from synthetic.folders import STEP_TIMES, write_measured_run, write_plan_folder

from autoplan.cli import main
from autoplan.cost.model import CostModel
from autoplan.report import figures
from autoplan.report.api import report
from autoplan.report.folder import load_plan_folder
from autoplan.solve.api import plan_graph
from autoplan.solve.outputs import write_outputs
from autoplan.types.cost import Cost


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    # 1f1b: its memory parts peak on different stages (the figure must not sum their maxima)
    result = write_plan_folder(root / "plan", fix="pp=2,schedule=1f1b")
    median = write_measured_run(root / "run", result.best)
    with pytest.MonkeyPatch.context() as patch:  # keep what memory.png draws
        patch.setattr(figures, "memory_figure", _recording(figures.memory_figure, root))
        paths = report(root / "plan", [root / "run"], out=root / "out", top_k=3)
    return root, result, median, paths


def _recording(draw, root):
    def memory_figure(bars, path, **kwargs):
        root.joinpath("memory_bars.json").write_text(
            json.dumps([{"label": b.label, "parts": b.parts_bytes, "peak": b.peak_bytes} for b in bars])
        )
        return draw(bars, path, **kwargs)

    return memory_figure


def test_plans_table_keeps_every_candidate_and_ranks_them(built):
    root, result, _, _ = built
    plans = pd.read_csv(root / "out" / "plans.csv")
    source = pd.read_csv(root / "plan" / "plans.csv")
    assert len(plans) == len(source) == len(result.candidates)
    feasible = plans[plans["feasible"].astype(str) == "True"]
    assert feasible["slowdown_vs_best"].min() == pytest.approx(0.0)
    assert (feasible["slowdown_vs_best"] >= -1e-12).all()
    assert set(plans["family"]) >= {f"dp={p} tp={t} pp=2" for p, t in ((4, 1),) if result.best.dp == 4} | {
        f"dp={result.best.dp} tp={result.best.tp} pp=2"
    }
    row = feasible.sort_values("step_time_s").iloc[0]
    assert row["peak_memory_gib"] == pytest.approx(row["peak_memory_bytes"] / 2**30)


def test_breakdown_table_holds_the_best_plans_terms(built):
    root, result, _, _ = built
    breakdown = pd.read_csv(root / "out" / "breakdown.csv")
    feasible = len(result.ranked())
    assert len(breakdown) == min(3, feasible) * len(Cost.TIME_FIELDS)
    first = breakdown[breakdown["rank"] == 1].set_index("term")["seconds"]
    for term in Cost.TIME_FIELDS:
        assert first[term] == pytest.approx(result.best.predicted.breakdown[term])
    assert first.sum() == pytest.approx(result.best.predicted.step_time_s)


def test_stage_and_op_tables(built):
    root, result, _, _ = built
    stages = pd.read_csv(root / "out" / "stages.csv")
    assert list(stages["stage"]) == list(range(result.best.pp))
    assert (stages["forward_s"] + stages["backward_s"]).tolist() == pytest.approx(stages["micro_batch_time_s"].tolist())
    assert (stages["backward_s"] > stages["forward_s"]).all()  # a backward does about twice a forward's FLOPs
    ops = pd.read_csv(root / "out" / "ops.csv")
    assert ops["share_of_compute"].sum() == pytest.approx(1.0)
    assert set(ops["stage"]) == set(range(result.best.pp))


def test_predicted_vs_measured_table(built):
    root, result, median, _ = built
    runs = pd.read_csv(root / "out" / "predicted_vs_measured.csv")
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["measured_step_time_s"] == pytest.approx(median)
    assert row["predicted_step_time_s"] == pytest.approx(result.best.predicted.step_time_s)
    assert row["measured_over_predicted"] == pytest.approx(median / result.best.predicted.step_time_s)
    steps = pd.read_csv(root / "out" / "measured_steps.csv")
    assert steps["step_time_s"].tolist() == pytest.approx(STEP_TIMES)


@pytest.mark.parametrize("name", ["timeline.png", "memory.png", "breakdown.png", "predicted_vs_measured.png"])
def test_every_figure_is_a_non_blank_png(built, name):
    root, _, _, paths = built
    path = root / "out" / name
    assert paths[name] == path and path.stat().st_size > 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 10  # drawn, not a blank canvas


def test_memory_figure_draws_the_priced_peak_of_the_breakdown_plans(built):
    """Each bar sums to the cost model's peak (report.md's number for the chosen plan), for the
    plans breakdown.png draws; the parts' own maxima would overstate it."""
    root, result, _, _ = built
    bars = json.loads((root / "memory_bars.json").read_text())
    breakdown = pd.read_csv(root / "out" / "breakdown.csv")
    assert [b["label"] for b in bars] == list(dict.fromkeys(breakdown["plan"]))
    folder = load_plan_folder(root / "plan")
    model = CostModel(folder.graph, folder.profile)
    for bar, candidate in zip(bars, result.ranked()):
        assert sum(bar["parts"].values()) == pytest.approx(bar["peak"])
        assert bar["peak"] == pytest.approx(model.estimate(candidate.plan).peak_memory_bytes)
    chosen = result.best.predicted.peak_memory_bytes
    assert bars[0]["peak"] == pytest.approx(chosen)
    assert f"{chosen / 2**30:.2f} GiB" in (root / "out" / "report.md").read_text()
    overstated = [sum(getattr(c.cost, f) for f in Cost.MEMORY_FIELDS) for c in result.ranked()[: len(bars)]]
    assert any(total > bar["peak"] * 1.01 for total, bar in zip(overstated, bars))  # what it drew before


def test_stage_memory_is_the_priced_peak(built):
    """stages.csv (and report.md's stage table) states each stage's priced peak: the largest is plan.json's."""
    root, result, _, _ = built
    stages = pd.read_csv(root / "plan" / "stages.csv")
    assert len(stages) == 2 and stages["memory_bytes"].max() == pytest.approx(
        result.best.predicted.peak_memory_bytes, abs=1
    )


@pytest.mark.parametrize("columns", ["80", "120"])
def test_cli_explain_prints_every_number_whole(built, monkeypatch, capsys, columns):
    root, _, _, _ = built
    monkeypatch.setenv("COLUMNS", columns)
    assert main(["explain", str(root / "plan")]) == 0
    printed = capsys.readouterr().out
    written = (root / "out" / "explain.md").read_text()
    number = re.compile(r"[+-]?[0-9][0-9.,]*[%x]?")
    assert "…" not in printed
    assert set(number.findall(written)) <= set(number.findall(printed))


def test_report_md_puts_it_together(built):
    root, result, _, _ = built
    text = (root / "out" / "report.md").read_text()
    assert result.best.describe() in text
    for name in ("timeline.png", "memory.png", "breakdown.png", "predicted_vs_measured.png"):
        assert f"]({name})" in text
    assert "## Explanation" in text and "Why each other family lost" in text
    assert (root / "out" / "explain.md").read_text() in text.replace("### ", "## ").replace("## Explanation\n\n", "")


def test_cli_report_and_explain(built, tmp_path, capsys):
    root, result, _, _ = built
    assert main(["--quiet", "report", str(root / "plan"), "--out", str(tmp_path / "r"), "--no-explain"]) == 0
    assert (tmp_path / "r" / "report.md").is_file() and not (tmp_path / "r" / "explain.md").exists()
    capsys.readouterr()
    assert main(["explain", str(root / "plan"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"] == result.best.describe()
    assert data["families"][0]["verdict"] == "chosen"


def test_cli_report_on_a_missing_folder_says_so(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1


def test_load_plan_folder_reads_the_planner_inputs(built):
    root, result, _, _ = built
    folder = load_plan_folder(root / "plan")
    assert folder.plan.describe() == result.best.describe()
    assert folder.graph is not None and folder.profile is not None
    assert folder.search_options["fixes"] == {"pp": 2, "schedule": "1f1b"}


def test_a_folder_where_nothing_fits_reports_the_closest_candidate(tmp_path, capsys):
    from autoplan.solve.api import NoPlanFits

    graph = synthetic_gpt(layers=2, hidden=512, heads=8, batch=8, seq=256)
    profile = synthetic_profile(memory_bytes=2**20)
    with pytest.raises(NoPlanFits) as caught:
        plan_graph(graph, devices=8, profile=profile, batch_size=8)
    write_outputs(tmp_path / "plan", result=caught.value.result, graph=graph, profile=profile)
    paths = report(tmp_path / "plan", out=tmp_path / "out")
    assert "timeline.png" not in paths and "explain.md" not in paths
    priced = [c for c in caught.value.result.candidates if c.cost is not None]
    frugal = min(priced, key=lambda c: c.cost.peak_memory_bytes)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "No plan fits" in text and frugal.cost.reason in text
    assert frugal.cost.reason in (tmp_path / "out" / "report.html").read_text()  # the page says it as report.md does
    assert main(["explain", str(tmp_path / "plan")]) == 2
    assert "no plan fit" in capsys.readouterr().err
