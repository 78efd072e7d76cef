"""The tracer: a PyTorch model -> a cost-annotated :class:`autoplan.types.Graph`.

torch.fx first, torch.export (non-strict) as the fallback; shapes, FLOPs and saved
activation bytes measured per node on FakeTensors; repeated blocks grouped. See docs/trace.md.
"""
from autoplan.trace.api import trace, trace_model_file

__all__ = ["trace", "trace_model_file"]
