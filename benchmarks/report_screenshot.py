"""docs/images/report.png: the screenshot of report.html that docs/report.md shows.

Plans the README's example (examples/gpt.py, 8 devices of the dgx-a100 profile, batch 16) with the
pipeline pinned to 2 stages so that the timeline has a schedule to show, writes its report with
`autoplan report`, and has Debian's Chromium (apt-get install chromium) draw the page headless: its
own --screenshot, given virtual time for plotly to draw. Needs no network.

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
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
