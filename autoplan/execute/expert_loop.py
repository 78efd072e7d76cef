"""MoE layers whose experts are a ``ModuleList``: every expert's parameters get a gradient, and at
tp > 1 the layer runs whole on every tp rank (docs/executor.md, "Expert parallelism", MoE layers
written as a loop).

Such a layer (``trace.moe.experts_of``; transformers 4.x Mixtral and Qwen2-MoE) skips an expert
that got no rows, so its parameters take no part in that rank's backward. DDP runs with
``find_unused_parameters`` (autoplan/execute/data_parallel.py); under FSDP2, ZeRO-1 and the explicit
all-reduce :func:`install` (``touch``) adds to the layer's output a zero that depends on every
parameter, so every expert gets a gradient (zero when it got no rows). At ``tp > 1`` the layer's
own code runs on local tensors: every DTensor input and parameter brought to ``Replicate``, every
output a ``Replicate`` DTensor again (its linears are ``tp_splittable = False``, trace/moe.py).
Expert parallelism and FP8 do not apply to these layers.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor, Replicate

from autoplan.execute.expert_dispatch import _local, _template
from autoplan.trace.moe import experts_of, is_hf_experts
from autoplan.types.plan import Plan


def list_layers(model: nn.Module) -> tuple[str, ...]:
    """FQNs of the MoE layers of ``model`` whose experts are a ``ModuleList``."""
    found = []
    for name, module in model.named_modules():
        experts = experts_of(name, module)
        if experts is not None and not is_hf_experts(experts[1]):
            found.append(name)
    return tuple(found)


def install(*, module: nn.Module, plan: Plan, layers: tuple[str, ...], touch: bool) -> int:
    """Give each of ``layers`` found in ``module`` (the model or one pipeline stage) the forward of
    the module docstring (``touch``: every parameter touched); return how many changed."""
    if plan.tp == 1 and not touch:
        return 0
    present = dict(module.named_modules())
    for fqn in layers:
        if fqn in present:
            present[fqn].forward = _forward(present[fqn], whole=plan.tp > 1, touch=touch)
    return sum(fqn in present for fqn in layers)


def _forward(layer: nn.Module, *, whole: bool, touch: bool) -> Callable:
    """The layer's own forward, with ``touch`` every parameter touched; with ``whole`` (tp > 1),
    on local tensors."""
    own, template = layer.forward, _template(layer)
    names = [name for name, _ in layer.named_parameters()]

    def forward(*args: Any, **kwargs: Any) -> Any:
        params = {name: layer.get_parameter(name) for name in names}
        mesh = next((t.device_mesh for t in (*pytree.tree_leaves((args, kwargs)), *params.values())
                     if isinstance(t, DTensor)), None)  # fmt: skip
        if not whole or mesh is None:
            return _touching(own(*args, **kwargs), list(params.values()) if touch else [])
        local_args, local_kwargs = pytree.tree_map(_local, (args, kwargs))
        local_params = {n: _local(p) for n, p in params.items()}
        out = torch.func.functional_call(template, local_params, local_args, local_kwargs)
        out = _touching(out, list(local_params.values()) if touch else [])
        replicate = [Replicate()] * mesh.ndim
        return pytree.tree_map_only(
            torch.Tensor, lambda t: DTensor.from_local(t, mesh, replicate, run_check=False), out
        )

    return forward


def _touching(out: Any, params: list[torch.Tensor]) -> Any:
    """``out`` with a zero that depends on every parameter added to its first floating tensor
    that needs a gradient: the sum of each parameter's empty slice, so an expert that got no
    rows gets a zero gradient (module docstring)."""
    leaves, spec = pytree.tree_flatten(out)
    first = next((i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad), None)
    if first is None or not params:
        return out
    leaves[first] = leaves[first] + sum(p.reshape(-1)[:0].sum() for p in params if p.requires_grad)
    return pytree.tree_unflatten(leaves, spec)
