"""docs/images/report.png and report_timeline.png: the screenshots of report.html that docs/report.md shows
(the page's top, and its timeline section with the predicted trace drawn as Perfetto lays it).

Plans the README's example (examples/gpt.py, 8 devices of the dgx-a100 profile, batch 16) with the
pipeline pinned to 2 stages so that the timeline has a schedule to show, writes its report with
`autoplan report`, and has Debian's Chromium (apt-get install chromium) draw the page headless: its
own --screenshot, given virtual time for plotly to draw; the timeline section through Playwright (the test
extras) as an element screenshot. Needs no network.

    python benchmarks/report_screenshot.py [--height PX]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images" / "report.png"
TIMELINE_OUT = ROOT / "docs" / "images" / "report_timeline.png"


def _autoplan(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "autoplan.cli", "--quiet", *args], check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=2600, help="pixels of the page to show (default 2600)")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("Chromium is not installed: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        plan, report = Path(tmp) / "plan", Path(tmp) / "report"
        _autoplan(
            "plan",
            "examples/gpt.py",
            *"--devices 8 --profile dgx-a100 --batch 16 --fix pp=2".split(),
            "--out",
            str(plan),
        )
        _autoplan("report", str(plan), "--out", str(report))
        flags = "--headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking --hide-scrollbars"
        subprocess.run(
            [
                chromium,
                *flags.split(),
                f"--user-data-dir={Path(tmp) / 'profile'}",
                f"--window-size=1280,{args.height}",
                "--virtual-time-budget=10000",
                f"--screenshot={OUT}",
                (report / "report.html").as_uri(),
            ],
            check=True,
            capture_output=True,
        )
        _timeline_section(chromium, report / "report.html", Path(tmp) / "profile-2")
    print(f"wrote {OUT.relative_to(ROOT)} and {TIMELINE_OUT.relative_to(ROOT)}")


def _timeline_section(chromium: str, page_path: Path, profile: Path) -> None:
    """The page's #timeline section, once every plotly figure has drawn."""
    from playwright.sync_api import sync_playwright

    args = "--headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking".split()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, args=args, headless=True, viewport={"width": 1280, "height": 900}
        )
        try:
            page = context.new_page()
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_function("() => document.querySelector('#figure-trace svg.main-svg')", timeout=60_000)
            page.locator("#timeline").screenshot(path=str(TIMELINE_OUT))
        finally:
            context.close()


if __name__ == "__main__":
    main()
