"""The tracer: a PyTorch model -> a cost-annotated :class:`autoplan.types.Graph`.

torch.fx first, torch.export (non-strict) as the fallback; shapes, FLOPs and saved
activation bytes measured per node on FakeTensors; repeated blocks grouped. See docs/trace.md.
``trace`` and ``trace_model_file`` are imported lazily, so the CLI starts without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["trace", "trace_model_file"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from autoplan.trace import api

        return getattr(api, name)
    raise AttributeError(f"module 'autoplan.trace' has no attribute '{name}'")
