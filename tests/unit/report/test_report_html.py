"""report.html (autoplan/report/html.py), read as text: `autoplan report` writes it beside report.md, one
self-contained page (plotly.js inlined once, nothing loaded from elsewhere) that states the same plan and
tables as report.md, escapes what it shows, links the plan folder's timeline.json for Perfetto when there
is one, and whose templates are package data. tests/unit/report/test_report_browser.py opens it in Chromium."""

from __future__ import annotations

import glob
import json
import re
import shutil
from html import unescape
from pathlib import Path

import pytest
import tomllib
from synthetic.folders import write_measured_run, write_plan_folder

import autoplan.report
from autoplan.cli import main
from autoplan.report.interactive import plotly_js

FIGURES = ("breakdown", "trace", "stage_memory", "memory", "predicted_vs_measured")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("html")
    result = write_plan_folder(root / "plan", fix="pp=2")
    write_measured_run(root / "run", result.best)
    args = ["--quiet", "report", str(root / "plan"), str(root / "run"), "--out", str(root / "out"), "--top-k", "3"]
    assert main(args) == 0
    return root, result


def _report(plan_dir: Path, out: Path) -> str:
    assert main(["--quiet", "report", str(plan_dir), "--out", str(out), "--no-explain"]) == 0
    return (out / "report.html").read_text()


def test_the_page_carries_plotly_once_and_loads_nothing_from_elsewhere(built):
    root, _ = built
    page = (root / "out" / "report.html").read_text()
    assert page.count(plotly_js()[:60]) == 1  # plotly.js's own banner: inlined once, for every figure
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    drawn = re.findall(r'Plotly\.newPlot\(\s*"([^"]+)"', page)
    assert drawn == [f"figure-{name}" for name in FIGURES]
    assert all(f'id="figure-{name}"' in page for name in FIGURES)


def _cells(lines: list[str]) -> list[str]:
    return [cell.strip() for line in lines if not line.startswith("|---") for cell in line.strip("|").split("|")]


def test_the_page_states_report_mds_plan_and_tables(built):
    root, result = built
    page = (root / "out" / "report.html").read_text()
    text = unescape(re.sub(r"<[^>]+>", "", page))
    assert result.best.describe() in text
    cells_found = re.findall(r"<t[dh](?:\s[^>]*)?>(.*?)</t[dh]>", page, flags=re.DOTALL)
    html_cells = [unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells_found]
    report_md = (root / "out" / "report.md").read_text()
    tables = re.findall(r"((?:^\|.*\|\n)+)", report_md, flags=re.MULTILINE)
    assert len(tables) >= 5  # top plans, stages, predicted vs measured, rivals, families, trade
    for table in tables:  # every cell of every table of report.md is a cell of the page, in order
        cells = [re.sub(r"\*\*|`", "", c) for c in _cells(table.splitlines())]
        assert any(html_cells[i : i + len(cells)] == cells for i in range(len(html_cells))), cells
    for line in (root / "out" / "explain.md").read_text().splitlines():
        if line.startswith("- "):  # the sensitivity's sentences
            assert re.sub(r"\*\*|`", "", line[2:]) in text


def test_text_is_escaped_and_sections_say_what_was_not_computed(built, tmp_path):
    root, _ = built
    odd = tmp_path / "a<b>&c"
    shutil.copytree(root / "plan", odd)
    page = _report(odd, tmp_path / "out")
    assert "autoplan report: a&lt;b&gt;&amp;c</title>" in page and "a<b>" not in page
    assert "Not computed: the report was written with <code>--no-explain</code>" in page
    assert "No run folders were given" in page


def test_the_predicted_trace_is_written_and_linked_for_perfetto(built, tmp_path):
    root, _ = built
    page = _report(root / "plan", tmp_path / "priced")  # priced again from the folder's graph and profile
    trace = json.loads((tmp_path / "priced" / "timeline.json").read_text())
    assert any(e.get("args", {}).get("name") == "stage 0" for e in trace["traceEvents"] if e["ph"] == "M")
    assert '<a href="timeline.json" download>' in page and "ui.perfetto.dev" in page and "Open trace file" in page
    assert 'id="figure-trace"' in page  # drawn from that file's events (interactive.trace)
    shutil.copytree(root / "plan", tmp_path / "plan")
    (tmp_path / "plan" / "graph.json").unlink()  # cannot be priced again: the folder's own file, else none
    page = _report(tmp_path / "plan", tmp_path / "without")
    assert "holds no <code>timeline.json</code>" in page and 'href="timeline.json"' not in page
    assert not (tmp_path / "without" / "timeline.json").exists()
    assert 'id="figure-timeline"' in page  # without a trace, the schedule simulated from stages.csv
    own = '{"traceEvents": [{"name": "forward", "ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 0}]}'
    (tmp_path / "plan" / "timeline.json").write_text(own)
    page = _report(tmp_path / "plan", tmp_path / "with")
    assert (tmp_path / "with" / "timeline.json").read_text() == own
    assert '<a href="timeline.json" download>' in page
    assert 'id="figure-trace"' in page and "more than the" not in page  # drawn on the trace's own pid/tid rows


def test_a_trace_too_large_to_draw_is_linked_and_said_so(built, tmp_path, monkeypatch):
    from autoplan.report import interactive

    root, _ = built
    monkeypatch.setattr(interactive, "MAX_TRACE_EVENTS", 3)
    page = _report(root / "plan", tmp_path / "large")
    events = json.loads((tmp_path / "large" / "timeline.json").read_text())["traceEvents"]
    assert f"The trace has {sum(e['ph'] == 'X' for e in events)} events, more than the 3" in page
    assert 'id="figure-trace"' not in page and '<a href="timeline.json" download>' in page
    assert 'id="figure-timeline"' in page


def test_every_template_is_package_data():
    """An installed wheel has the templates: pyproject's package-data globs cover every one."""
    package = Path(autoplan.report.__file__).parent
    templates = sorted(str(p.relative_to(package)) for p in (package / "templates").iterdir())
    assert "templates/report.html.j2" in templates
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {str(Path(p).relative_to(package)) for g in globs["autoplan.report"] for p in glob.glob(str(package / g))}
    assert set(templates) <= shipped
