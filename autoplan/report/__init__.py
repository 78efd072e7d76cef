"""Reports and explanations: plan and run folders -> tidy CSVs, PNG figures, report.md, and
the planner's reasons (``explain``). Imported lazily, so the CLI starts without matplotlib.

    from autoplan.report import report, explain
    report("plan_dir", ["run_dir"], out="report_dir")   # -> {name: path}
    print(explain("plan_dir").to_markdown())             # or explain(search_result, graph=..., profile=...)
"""

from __future__ import annotations

import importlib
from typing import Any

_API = {"report": "autoplan.report.api", "explain": "autoplan.report.explain", "Explanation": "autoplan.report.explain"}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'autoplan.report' has no attribute '{name}'")
    return getattr(importlib.import_module(_API[name]), name)
