"""Time each distinct (op, shape) of a traced model: the profile's measured op table.

Uses the tracer (``autoplan.trace.trace_model_file``) and rebuilds the compute-heavy ops
from node attributes: ``linear`` as a (tokens x in) @ (in x out) matmul, ``attention`` as
SDPA over (batch, heads, q_len, head_dim). Other kinds are priced by the roofline model.
Times are medians over repeats (see timing.median_time_s). Rows use the op kind of the
graph node ("linear", "attention") so the cost model can look a node up by (op, shape, dtype).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autoplan.errors import ProfileError
from autoplan.profile.measure.compute import OpCase, attention_case, matmul_case, time_case
from autoplan.types.profile import OpTiming


def node_case(node: Any) -> OpCase | None:
    """The timing case for one graph node, or None when its kind is not timed."""
    attrs, out = node.attrs or {}, list(node.output_shape or [])
    if node.op == "linear" and out and "in_features" in attrs:
        case = matmul_case(m=math.prod(out[:-1]), n=int(attrs["out_features"]), k=int(attrs["in_features"]))
        return OpCase("linear", case.shape, case.flops, case.build)
    if node.op == "attention" and {"num_heads", "head_dim", "q_len"} <= set(attrs):
        heads, dim, seq = int(attrs["num_heads"]), int(attrs["head_dim"]), int(attrs["q_len"])
        batch = max(1, math.prod(out) // (heads * dim * seq)) if out else 1
        return attention_case(batch=batch, heads=heads, seq=seq, head_dim=dim)
    return None


def time_model_ops(*, model_path: Path, batch: int, device: torch.device, dtypes: list[str], budget_s: float,
                   on_op: Callable[..., Any]) -> list[OpTiming]:
    try:
        from autoplan.trace import trace_model_file
    except ImportError:
        raise ProfileError("--model needs the tracer (autoplan.trace.trace_model_file), which this install does not have; "
                           "profile without --model.") from None
    graph = trace_model_file(model_path, batch_size=batch)
    cases = {}
    for node in graph.nodes:
        case = node_case(node)
        if case is not None:
            cases.setdefault((case.op_class, case.shape), case)
    rows = []
    for dtype in dtypes:
        for case in cases.values():
            rows.append(time_case(case, dtype_name=dtype, device=device, budget_s=budget_s))
            on_op()
    return rows
