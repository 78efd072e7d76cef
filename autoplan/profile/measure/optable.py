"""The distinct compute-heavy ops of a traced model, as cases for the profile's measured op table.

Uses the tracer (``autoplan.trace.trace_model_file``) and rebuilds the compute-heavy ops
from node attributes: ``linear`` as the matmul case of m = tokens, k = in, n = out (compute.py
``matmul_case``), ``attention`` as SDPA over (batch, heads, q_len, head_dim) with the node's
causal flag. Other kinds are priced by the roofline model. The N measuring processes time
them together (measure/ranks.py).

What a row holds (docs/profile-format.md, "What an op_table row times"):
* ``linear`` rows: the forward GEMM and both backward GEMMs (grad-input, grad-weight), in
  the layouts autograd runs them, shape ``m=..,n=..,k=..,fwd+bwd``; ``flops`` = 6*m*n*k, their
  sum. The cost model (autoplan/cost/compute/roofline.py ``_measured_s``) looks a linear node up by
  that key and splits the row by FLOPs: forward 1/3 of its time, backward 2/3.
* ``attention`` rows: forward + backward (shape ends in ``,fwd+bwd``; ``flops`` is their sum),
  like the attention sweep the efficiency curve is fitted on.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from autoplan.errors import ProfileError
from autoplan.profile.measure.compute import CaseSpec, spec


def node_spec(node: Any) -> CaseSpec | None:
    """The timing case for one graph node, or None when its kind is not timed."""
    attrs, out = node.attrs or {}, list(node.output_shape or [])
    if node.op == "linear" and out and "in_features" in attrs:
        return spec(
            "matmul", "linear", m=math.prod(out[:-1]), n=int(attrs["out_features"]), k=int(attrs["in_features"])
        )
    if node.op == "attention" and {"num_heads", "head_dim", "q_len"} <= set(attrs):
        heads, dim, seq = int(attrs["num_heads"]), int(attrs["head_dim"]), int(attrs["q_len"])
        batch = max(1, math.prod(out) // (heads * dim * seq)) if out else 1
        return spec("attention", batch=batch, heads=heads, seq=seq, head_dim=dim, causal=int(bool(attrs.get("causal"))))
    return None


def model_specs(*, model_path: Path, batch: int) -> list[CaseSpec]:
    """One case per distinct (op, shape) of the traced model, in graph order."""
    try:
        from autoplan.trace import trace_model_file
    except ImportError:
        raise ProfileError(
            "--model needs the tracer (autoplan.trace.trace_model_file), which this install does not have; "
            "profile without --model."
        ) from None
    graph = trace_model_file(model_path, batch_size=batch)
    return list(dict.fromkeys(s for s in (node_spec(node) for node in graph.nodes) if s is not None))
