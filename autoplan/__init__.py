"""autoplan: model.py -> trace -> graph -> costs -> ILP plan -> distributed run -> report.

The public API is imported lazily, so ``import autoplan`` stays cheap and planning code
never pulls in torch.distributed.
"""

from __future__ import annotations

import importlib
from typing import Any

from autoplan.version import __version__ as __version__

_API = {
    "trace": "autoplan.trace",
    "trace_model_file": "autoplan.trace",
    "load_model_file": "autoplan.modelfile",
    "load_profile": "autoplan.profile",
    "measure_profile": "autoplan.profile",
    "estimate": "autoplan.cost",
    "plan": "autoplan.solve",
    "sweep": "autoplan.solve",
    "RunSpec": "autoplan.types",
    "RunEstimate": "autoplan.types",
    "parallelize": "autoplan.execute",
    "checkpointer": "autoplan.execute.checkpoint.api",
    "resume": "autoplan.execute.checkpoint.api",
    "replan": "autoplan.cli.checkpoints",
    "report": "autoplan.report",
    "export_plan": "autoplan.export.api",
    "import_config": "autoplan.export.api",
    "price_config": "autoplan.export.api",
    "Graph": "autoplan.types",
    "Plan": "autoplan.types",
    "Profile": "autoplan.types",
    "Cost": "autoplan.types",
    "AutoplanError": "autoplan.errors",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'autoplan' has no attribute '{name}'")
    return getattr(importlib.import_module(_API[name]), name)
