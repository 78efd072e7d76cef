"""Splitting a batch along dim 0: the dp rank's share and the micro-batches.

A batch is any nesting of tuples, lists and dicts whose tensors have the batch on dim 0;
tensors whose dim 0 is not the batch size (and non-tensors) are passed whole.
"""

from __future__ import annotations

from typing import Any

import torch


def slice_batch(obj: Any, *, start: int, stop: int, batch_size: int) -> Any:
    """Rows ``start:stop`` of every tensor in ``obj`` whose dim 0 equals ``batch_size``."""
    if isinstance(obj, torch.Tensor):
        return obj[start:stop] if obj.dim() > 0 and obj.shape[0] == batch_size else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(slice_batch(o, start=start, stop=stop, batch_size=batch_size) for o in obj)
    if isinstance(obj, dict):
        return {k: slice_batch(v, start=start, stop=stop, batch_size=batch_size) for k, v in obj.items()}
    return obj


def shard_batch(obj: Any, *, index: int, parts: int, batch_size: int) -> Any:
    """Part ``index`` of ``parts`` equal parts of a batch of ``batch_size`` samples."""
    size = batch_size // parts
    return slice_batch(obj, start=index * size, stop=(index + 1) * size, batch_size=batch_size)


def move_to(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(move_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: move_to(v, device) for k, v in obj.items()}
    return obj


def microbatch_from_specs(specs: list, *, micro_batch_size: int) -> tuple:
    """Forward args for one micro-batch, built from the traced inputs' specs
    (:class:`autoplan.types.inputs.InputSpec`): zeros of each tensor's dtype, dim 0 of a batched
    one set to ``micro_batch_size``; scalars as recorded. Only shapes and dtypes are read from
    them (the pipeline split exports the model on them; zero is a valid index for any embedding)."""
    args = []
    for spec in specs:
        if spec.kind == "value":
            args.append(spec.value)
            continue
        shape = [micro_batch_size, *spec.shape[1:]] if spec.batched else list(spec.shape)
        args.append(torch.zeros(shape, dtype=getattr(torch, spec.dtype)))
    return tuple(args)
