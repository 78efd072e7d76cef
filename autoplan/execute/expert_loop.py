"""MoE layers whose experts are a ``ModuleList``: every expert's parameters get a gradient, and at
tp > 1 the layer runs whole on every tp rank.

Such a layer (``trace.moe.experts_of``: a router with one output per expert beside a list of
alike experts; transformers 4.x Mixtral and Qwen2-MoE, most research code) usually loops over its
experts and skips one that got no rows (``if top_x.numel() == 0: continue``, or a loop over the
experts that were hit). Its parameters then take no part in that rank's backward. DDP refuses
that unless told to look for such parameters ("Expected to have finished reduction in the prior
iteration"), so for a model with such layers it runs with ``find_unused_parameters``
(autoplan/execute/data_parallel.py): a rank that did not use an expert reduces zeros for it, and
an expert no rank used keeps no gradient, as on one device. FSDP2, ZeRO-1 and the explicit
all-reduce reduce whatever gradients a rank has, so with them :func:`install` (``touch``) gives
each such layer a forward that adds to its output a zero that depends on every one of its
parameters (the sum of each parameter's empty slice): every expert gets a gradient, zero when it
got no rows, as in the Hugging Face interface (autoplan/execute/expert_dispatch.py). The one
difference from a single device: an expert that no token of the whole step reached gets a zero
gradient rather than none, so AdamW still decays its weights and moves them by its moments.

At ``tp > 1`` DTensor has no sharding strategy for the loop's ``torch.where``/``nonzero``; the
layer's inputs arrive as DTensors and its parameters are ``Replicate`` DTensors
(autoplan/execute/tensor_parallel.py). The forward then runs the layer's own code on local
tensors: every DTensor input and parameter brought to ``Replicate`` and taken as its
(differentiable) local value, and every tensor output made a ``Replicate`` DTensor again. The
tracer marks the layer's linears ``tp_splittable = False`` (trace/moe.py
``keep_list_layers_whole``), so the plan never splits them and the cost model prices the layer
whole on every tp rank, as it is run here. Every tp rank holds the same tokens (tensor
parallelism splits no batch), so each computes the same output and gradients: no collective is
needed beyond bringing a sequence-sharded input whole.

Expert parallelism does not apply to these layers (docs/moe.md), and they are not converted to
FP8 (the cost model prices only tp-splittable linears in FP8, cost/compute/roofline.py).
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
