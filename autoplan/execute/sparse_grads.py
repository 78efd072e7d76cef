"""Sparse embedding gradients in the executor (docs/executor.md, "Sparse embedding gradients").

DDP all-reduces a sparse gradient as a sparse tensor on its own (gloo's sparse all-reduce:
coalesce, all-gather indices and values, sum). Before the optimizer step each synced sparse
gradient is made dense, so AdamW steps every row as it does for the dense reference (its moments
decay and its weight decay applies on rows the batch did not read; SparseAdam, a lazy Adam that
steps only the read rows, would be another optimizer than the one the run is verified against).
The dense gradient is dropped before the next backward, whose sparse gradient DDP expects to
find unset. Plans that cannot run it are refused (autoplan/types/sparse_grads.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from autoplan.errors import PlanError
from autoplan.modelfile import ModelFile, ModelFileError
from autoplan.types.plan import Plan
from autoplan.types.sparse_grads import sparse_grad_refusal


def sparse_tables(model: nn.Module) -> list[str]:
    """FQNs of the tables ``model``'s nn.Embedding and nn.EmbeddingBag modules read with sparse=True."""
    return [
        f"{name}.weight" if name else "weight"
        for name, module in model.named_modules()
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse and module.weight.requires_grad
    ]


def check_runs_here(model: nn.Module, plan: Plan) -> None:
    """Raise the one-sentence PlanError when ``plan`` cannot run ``model``'s sparse gradients."""
    refusal = sparse_grad_refusal(plan, sparse_tables(model))
    if refusal is not None:
        raise PlanError(refusal)


def check_model_file(model_file: ModelFile, plan: Plan) -> None:
    """:func:`check_runs_here` on the model file's model built on the meta device (before any rank starts),
    built only where ``plan`` could not run a sparse table. A model that builds only inside a rank (it reads
    the rank's environment, ``RANK``) is left to the ranks, whose ``parallelize`` makes the same check."""
    if sparse_grad_refusal(plan, ["a sparse table"]) is None:
        return  # this plan runs sparse tables: no user code in the launcher
    try:
        with torch.device("meta"):
            model = model_file.build()
    except ModelFileError:
        return  # the ranks build it, and say so if it fails there too
    check_runs_here(model, plan)


def densify_grads(params: list[nn.Parameter]) -> list[nn.Parameter]:
    """Replace each sparse gradient among ``params`` with its dense sum (duplicate rows added); the ones replaced."""
    done = []
    for param in params:
        if param.grad is not None and param.grad.is_sparse:
            param.grad = param.grad.coalesce().to_dense()
            done.append(param)
    return done


def release_grads(params: list[nn.Parameter]) -> None:
    """Unset the densified gradients, so the next backward makes them sparse again."""
    for param in params:
        param.grad = None
