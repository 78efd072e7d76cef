"""MoE layers whose experts are a ``ModuleList``, under tensor parallelism: run whole on every tp rank.

Such a layer (``trace.moe.experts_of``: a router with one output per expert beside a list of
alike experts; transformers 4.x Mixtral and Qwen2-MoE, most research code) usually loops over its
experts and selects each one's rows with ``torch.where``/``nonzero``, which DTensor has no
sharding strategy for. At ``tp > 1`` its inputs arrive as DTensors and its parameters are
``Replicate`` DTensors (autoplan/execute/tensor_parallel.py), so :func:`run_list_layers_whole`
gives each such layer a forward that runs the layer's own code on local tensors: every DTensor
input and parameter brought to ``Replicate`` and taken as its (differentiable) local value, and
every tensor output made a ``Replicate`` DTensor again. The tracer marks the layer's linears
``tp_splittable = False`` (trace/moe.py ``keep_list_layers_whole``), so the plan never splits
them and the cost model prices the layer whole on every tp rank, as it is run here. Every tp rank
holds the same tokens (tensor parallelism splits no batch), so each computes the same output and
the same gradients: no collective is needed beyond bringing a sequence-sharded input whole.

At ``tp = 1`` nothing changes: the layer runs as written, on plain tensors. Expert parallelism
does not apply to these layers (docs/moe.md), and they are not converted to FP8 (the cost model
prices only tp-splittable linears in FP8, cost/compute.py).
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


def run_list_layers_whole(*, module: nn.Module, plan: Plan, layers: tuple[str, ...]) -> int:
    """At tp > 1, make each of ``layers`` found in ``module`` (the model or one pipeline stage)
    run whole on local tensors (module docstring); return how many were changed."""
    if plan.tp == 1:
        return 0
    present = dict(module.named_modules())
    for fqn in layers:
        if fqn in present:
            present[fqn].forward = _whole_forward(present[fqn])
    return sum(fqn in present for fqn in layers)


def _whole_forward(layer: nn.Module) -> Callable:
    template = _template(layer)
    names = [name for name, _ in layer.named_parameters()]

    def forward(*args: Any, **kwargs: Any) -> Any:
        params = {name: layer.get_parameter(name) for name in names}
        mesh = next((t.device_mesh for t in (*pytree.tree_leaves((args, kwargs)), *params.values())
                     if isinstance(t, DTensor)), None)  # fmt: skip
        if mesh is None:
            return torch.func.functional_call(template, params, args, kwargs)
        local_args, local_kwargs = pytree.tree_map(_local, (args, kwargs))
        out = torch.func.functional_call(template, {n: _local(p) for n, p in params.items()}, local_args, local_kwargs)
        replicate = [Replicate()] * mesh.ndim
        return pytree.tree_map_only(
            torch.Tensor, lambda t: DTensor.from_local(t, mesh, replicate, run_check=False), out
        )

    return forward
