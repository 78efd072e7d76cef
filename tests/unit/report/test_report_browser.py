"""report.html in a real browser: Debian's Chromium, headless, driven by Playwright with a new empty
profile, opens the page from disk with every request off the disk refused. It renders with no console
error and no page error, shows the chosen plan, and every plotly figure has drawn its SVG (the predicted
trace one bar per event); a full-page screenshot is kept as the
test's artifact (report.png in the test's tmp_path, printed). Skipped, saying why, only where Chromium or
Playwright is not installed (.ci/run installs Chromium with apt-get; Playwright comes with the test extras)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
from synthetic.folders import write_measured_run, write_plan_folder

from autoplan.cli import main

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: headless, no sandbox (CI runs as root), and nothing that reaches out on its own
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: every plotly figure of the page has drawn its SVG
DRAWN = "() => [...document.querySelectorAll('.plotly-graph-div')].every(d => d.querySelector('svg.main-svg'))"


def _playwright():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed: pip install -e '.[test]' installs it"
    )
    if not Path(CHROMIUM).is_file():
        pytest.skip("Chromium is not installed: apt-get install chromium (.ci/run installs it)")
    return sync_api


class Page:
    """What a headless Chromium saw of a page: its console and page errors, its requests, and a handle."""

    def __init__(self, context):
        self.errors, self.refused = [], []
        self.page = context.new_page()
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page: {e}"))
        context.route("**/*", self._local_only)

    def _local_only(self, route):
        if route.request.url.startswith(("file:", "data:", "blob:")):
            return route.continue_()
        self.refused.append(route.request.url)
        return route.abort()


@pytest.mark.slow  # a browser of several processes
def test_report_html_renders_in_headless_chromium(tmp_path):
    sync_api = _playwright()
    result = write_plan_folder(tmp_path / "plan", fix="pp=2")
    write_measured_run(tmp_path / "run", result.best)
    out = tmp_path / "out"
    assert main(["--quiet", "report", str(tmp_path / "plan"), str(tmp_path / "run"), "--out", str(out)]) == 0
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        try:
            seen = Page(context)
            seen.page.goto((out / "report.html").as_uri(), wait_until="load")
            seen.page.wait_for_function(DRAWN, timeout=60_000)
            plan_text = seen.page.inner_text("#plan")
            bars = seen.page.evaluate(
                "() => Object.fromEntries([...document.querySelectorAll('.plotly-graph-div')]"
                ".map(d => [d.id, d.querySelectorAll('g.point').length]))"
            )
            seen.page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            context.close()
    print(f"screenshot: {tmp_path / 'report.png'}")
    assert seen.errors == [] and seen.refused == []
    assert result.best.describe() in plan_text
    assert set(bars) == {
        f"figure-{n}" for n in ("breakdown", "trace", "memory", "stage_memory", "predicted_vs_measured")
    }
    assert all(count > 0 for count in bars.values()), bars
    trace = json.loads((out / "timeline.json").read_text())
    assert bars["figure-trace"] == sum(e["ph"] == "X" for e in trace["traceEvents"])  # one bar per trace event
    image = mpimg.imread(tmp_path / "report.png")
    assert image.shape[0] > 2000 and len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 100
