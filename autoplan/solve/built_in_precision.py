"""The 16-bit precision a model was built in: every floating parameter bf16 (``torch_dtype=torch.bfloat16``, or
``.to(torch.bfloat16)``), or every one fp16. Such a model computes in it whatever autocast says, so the search plans it
in that precision only (solve/space.py ``precision_options``; docs/ilp.md)."""

from __future__ import annotations

from autoplan.types.graph import Graph

SIXTEEN_BITS = {"bfloat16": "bf16", "float16": "fp16"}


def built_in_precision(graph: Graph) -> str:
    """``bf16`` or ``fp16`` where every floating parameter of ``graph`` is of that dtype, else ""."""
    dtypes = {p.dtype for p in graph.parameters.values() if "float" in p.dtype}
    return SIXTEEN_BITS.get(dtypes.pop(), "") if len(dtypes) == 1 else ""
