"""The batch on dim 0 of every input: the rule the executor splits batches by, checked when a model file is traced.

autoplan splits a global batch along dim 0 of every tensor whose dim 0 is the batch (execute/batch.py: each dp
rank's share, the micro-batches, a pipeline's micro-batch). A model file whose ``example_inputs(B)`` holds the batch
on another dim (an ``nn.GRU`` without ``batch_first``: ``(seq, batch)``; an initial hidden state
``(layers, batch, hidden)``) would be split along its sequence or not at all, and train on other gradients than the
model's (the reference --verify compares with splits the same way). ``example_inputs`` is called again at twice the
batch, on the meta device: a dim that grows with the batch and is not dim 0, or a dim 0 that grows but is not the
batch (a flattened ``batch * seq``), is refused in one sentence. A file whose inputs cannot be built at twice the
batch, or change their structure with it, is not checked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from autoplan.errors import TraceError


def check_batch_dims(model_file: Any, batch_size: int, inputs: Any, target: Any) -> None:
    """Raise TraceError when a tensor of ``inputs`` or ``target`` (built at ``batch_size``) holds the batch
    elsewhere than on dim 0 (module docstring)."""
    try:
        with torch.device("meta"):
            probe = (model_file.inputs(2 * batch_size), model_file.target(2 * batch_size))
    except Exception:  # the file's own limits on the batch: nothing to compare with
        return
    for what, built, grown in (("example_inputs", inputs, probe[0]), ("example_target", target, probe[1])):
        if (sentence := _refusal(what, batch_size, built, grown)) is not None:
            raise TraceError(sentence)


def _refusal(what: str, batch_size: int, built: Any, grown: Any) -> str | None:
    leaves, spec = tree_flatten(built)
    grown_leaves, grown_spec = tree_flatten(grown)
    if spec != grown_spec:
        return None
    for i, (a, b) in enumerate(zip(leaves, grown_leaves)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != b.dim():
            continue
        moved = [d for d in range(a.dim()) if a.shape[d] != b.shape[d]]
        if not moved or (moved == [0] and a.shape[0] == batch_size):
            continue
        shape = list(a.shape)
        if moved[0] != 0:
            where = f"holds the batch of {batch_size} on dim {moved[0]}"
        elif shape[0] != batch_size:
            where = f"has a dim 0 of {shape[0]} that grows with the batch but is not the batch of {batch_size}"
        else:  # a (batch, batch) pairing: the split would cut its rows and keep every column
            where = f"grows with the batch on dims {moved}, not on dim 0 alone"
        return (
            f"{what}({batch_size})'s tensor {i} (shape {shape}) {where}, and autoplan splits batches along dim 0 "
            "(data-parallel shares, micro-batches); make the batch the first dimension (nn.LSTM/GRU/RNN: "
            "batch_first=True, a hidden state passed in as (batch, ...)) and transpose inside forward() if needed."
        )
    return None
