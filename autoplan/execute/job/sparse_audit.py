"""The audit's view of a sparse embedding gradient's all-reduce (docs/cost-model.md, "Sparse embedding
gradients"): DDP hands gloo the uncoalesced gradient, which gloo coalesces and all-gathers, indices then
values. Measured as cost/dp/sparse_embedding.py prices it: two all-gathers of p times this rank's
coalesced rows (each rank sends its own rows; a rank sees only its own count, so p times it stands for
the sum), and the rows themselves under the kind ``touched_rows`` (count: tables, "bytes": rows).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

TOUCHED_ROWS = "touched_rows"


def sparse_messages(kind: str, message: Any, group_size: int) -> list[tuple[str, int, int]] | None:
    """(kind, bytes, count) records for an all-reduce of sparse tensors; None for any other collective."""
    leaves = [t for t in tree_flatten(message)[0] if isinstance(t, torch.Tensor)]
    if kind != "all_reduce" or not leaves or not all(t.is_sparse for t in leaves):
        return None
    found = []
    for tensor in leaves:
        rows = tensor.coalesce()
        indices, values = rows.indices(), rows.values()
        found.append(("all_gather", group_size * indices.numel() * indices.element_size(), 1))
        found.append(("all_gather", group_size * values.numel() * values.element_size(), 1))
        found.append((TOUCHED_ROWS, rows._nnz(), 1))
    return found


def c10d_records(kind: str, message: Any, group_size: int, dense_bytes: Callable[[Any], int]) -> list:
    """What the audit records for one c10d collective: :func:`sparse_messages`, else (kind, its bytes, 1)."""
    return sparse_messages(kind, message, group_size) or [(kind, dense_bytes(message), 1)]
