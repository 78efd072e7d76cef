"""Trace Mixture-of-Experts layers as they are written, under a routing model (types/moe.py).

Routed experts send each (token, choice) pair to the expert the router picked: how many pairs an
expert gets depends on the data (``histc``, ``nonzero``, ``sort``, ``index_add`` in Hugging
Face's and most other implementations), which fake tensors do not have. So the tracer runs the
router as written (top-k on fake tensors has static shapes) and replaces only the dispatch to
the experts, for the length of the trace, by what a grouped-GEMM run computes under the routing
model (:func:`routed_experts`): each expert's slots gathered into one ``[experts, slots, hidden]``
tensor, the expert FFN as batched matmuls on the experts' own weights, and the combine weighted
by the router's scores, so the router's gradient, the FLOPs and the saved activations are
measured on the real parameters. The user's code and model are left unchanged.

Recognised experts modules (:func:`is_hf_experts`): the experts interface Hugging Face
transformers uses for every MoE family (Mixtral, Qwen2/3-MoE, DeepSeek-V3, OLMoE, GPT-OSS, ...):
a module with ``num_experts``, 3-D ``gate_up_proj``/``up_proj`` and ``down_proj`` of leading
dimension ``num_experts``, called as ``experts(hidden [T, H], top_k_index [T, k],
top_k_weights [T, k]) -> [T, H]``. A model whose routing has static shapes (a capacity-based
dispatch written with one-hot einsums, examples/moe.py) traces as written; its experts are a
``ModuleList`` of alike modules beside a router with one output per expert. Either way the
graph records each layer (:func:`describe`).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn as nn

from autoplan.errors import TraceError
from autoplan.trace.moe_loop import loop_routed
from autoplan.types.graph import within
from autoplan.types.moe import MoELayer, RoutingModel

_TOP_K_NAMES = ("top_k", "num_experts_per_tok", "k", "moe_top_k", "router_topk")
_SHARED_NAMES = ("shared_expert", "shared_experts", "shared_mlp")


def is_hf_experts(module: nn.Module) -> bool:
    """The Hugging Face experts interface (module docstring)."""
    experts = getattr(module, "num_experts", None)
    down = getattr(module, "down_proj", None)
    up = getattr(module, "gate_up_proj", getattr(module, "up_proj", None))
    return (
        isinstance(experts, int)
        and hasattr(module, "is_transposed")
        and all(isinstance(w, nn.Parameter) and w.dim() == 3 and w.shape[0] == experts for w in (up, down))
    )


@dataclass
class RoutingLog:
    """What the routed layers saw while traced: tokens per experts module (FQN -> T), and the
    experts modules of loop-written layers whose data-dependent row selections were sized."""

    tokens: dict[str, int] = field(default_factory=dict)
    sized: set[str] = field(default_factory=set)


@contextlib.contextmanager
def routed(model: nn.Module, routing: RoutingModel) -> Iterator[RoutingLog]:
    """Run every recognised experts module of ``model`` under ``routing`` while inside (the
    grouped interface here, loop-written layers by trace/moe_loop.py); yields the
    :class:`RoutingLog`, filled in as the trace runs."""
    log = RoutingLog()
    seen = log.tokens
    patched = [(m, name, m.__dict__.get("forward")) for name, m in model.named_modules() if is_hf_experts(m)]
    for module, name, _ in patched:
        module.forward = routed_experts(module, routing, lambda tokens, name=name: seen.__setitem__(name, tokens))
    try:
        with loop_routed(model, _expert_lists(model), routing, log.tokens, log.sized):
            yield log
    finally:
        for module, _, own in patched:
            del module.forward
            if own is not None:
                module.forward = own


def _expert_lists(model: nn.Module) -> dict[str, tuple[str, int]]:
    """MoE layers whose experts are a ``ModuleList`` (FQN -> (experts FQN, expert count)): their
    forward loops over the experts, traced under trace/moe_loop.py."""
    layers = {}
    for name, module in model.named_modules():
        found = experts_of(name, module)
        if found is not None and not is_hf_experts(found[1]):
            layers[name] = (found[0], len(found[1]))
    return layers


def routed_experts(module: nn.Module, routing: RoutingModel, saw: Callable[[int], None]) -> Callable:
    """The experts' forward under ``routing`` (module docstring), on the module's own weights."""

    def forward(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        tokens, width = hidden.shape
        k, experts = top_k_index.shape[-1], module.num_experts
        saw(tokens)
        slots = routing.slots_per_expert(tokens, k, experts)
        pairs = torch.arange(experts * slots, device=hidden.device) % (tokens * k)  # a balanced assignment
        x = hidden.index_select(0, pairs // k).view(experts, slots, width)
        up = module.gate_up_proj if module.has_gate else module.up_proj
        h = _expert_linear(module, x, up, "gate_up_proj_bias" if module.has_gate else "up_proj_bias")
        h = module._apply_gate(h) if module.has_gate else module.act_fn(h)
        out = _expert_linear(module, h, module.down_proj, "down_proj_bias")
        if getattr(module, "has_post_expert_norm", False):
            out = module.post_expert_norm(out)
        return _combine(out.reshape(experts * slots, width), top_k_weights, tokens * k).view(tokens, k, width).sum(1)

    return forward


def _expert_linear(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias_name: str) -> torch.Tensor:
    """``x [E, C, in]`` through each expert's weight (``[E, out, in]``, or ``[E, in, out]`` when
    the module stores it transposed), as one batched matmul: a grouped GEMM of equal groups."""
    y = torch.bmm(x, weight if module.is_transposed else weight.transpose(1, 2))
    bias = getattr(module, bias_name, None) if getattr(module, "has_bias", False) else None
    return y if bias is None else y + bias.unsqueeze(1)


def _combine(out: torch.Tensor, weights: torch.Tensor, pairs: int) -> torch.Tensor:
    """The computed slots back to the ``pairs`` (token, choice) rows, scaled by the router's
    scores: slots beyond the pairs are padding; pairs beyond the slots were dropped (zeros)."""
    if out.shape[0] >= pairs:
        out = out[:pairs]
    else:
        out = torch.cat([out, out.new_zeros(pairs - out.shape[0], out.shape[1])])
    return out * weights.reshape(-1, 1).to(out.dtype)


# ---- what the graph records ---------------------------------------------------------------
def describe(
    model: nn.Module, records: list, *, routing: RoutingModel, log: RoutingLog, tokens: int, blocks: list[str]
) -> list[MoELayer]:
    """One :class:`MoELayer` per MoE layer of ``model``: its experts found by structure, its top-k
    from the module's attributes or, failing those, from the last ``topk`` its block ran."""
    found = []
    for name, module in model.named_modules():
        experts = experts_of(name, module)
        if experts is not None:
            layer = _layer(name, module, experts, records, routing, log.tokens, tokens, blocks)
            layer.data_dependent = experts[0] in log.sized
            found.append(layer)
    return found


def keep_list_layers_whole(graph) -> None:
    """Mark the linears of every MoE layer whose experts are a ``ModuleList`` (router and experts)
    ``tp_splittable = False``: at tp > 1 the executor runs such a layer whole on every
    tensor-parallel rank, on local tensors (autoplan/execute/expert_loop.py), since DTensor has no
    strategy for the data-dependent row selections of a loop over experts; the cost model then
    prices it so (cost/tp/splits.py ``legal_splits``)."""
    layers = [m.module for m in graph.moe_layers if m.interface == "module_list"]
    for node in graph.nodes:
        if node.op == "linear" and any(within(node.module, layer) for layer in layers):
            node.attrs["tp_splittable"] = False


def experts_of(name: str, module: nn.Module) -> tuple[str, nn.Module] | None:
    """The routed experts directly inside MoE block ``module``, if it is one."""
    for child_name, child in module.named_children():
        if is_hf_experts(child) or _is_expert_list(module, child):
            return f"{name}.{child_name}" if name else child_name, child
    return None


def _is_expert_list(parent: nn.Module, child: nn.Module) -> bool:
    """Experts held as a ModuleList of alike modules, beside a router with one output per expert."""
    if not isinstance(child, nn.ModuleList) or len(child) < 2:
        return False
    shapes = {tuple((n, tuple(p.shape)) for n, p in m.named_parameters()) for m in child}
    if len(shapes) != 1 or not next(iter(shapes)) or len({type(m) for m in child}) != 1:
        return False
    return _router(parent, len(child)) is not None and _picks_experts(parent)


#: what a block's forward that routes tokens to experts calls to pick them
_PICKS = ("topk", "top_k", "argmax", "argsort", ".max(", ".sort(")


def _picks_experts(parent: nn.Module) -> bool:
    """Whether ``parent`` picks experts per token: a top-k attribute, or a pick in its forward's code. A stack
    of alike blocks beside a head with one output per block (two blocks and a two-class head) is no MoE layer,
    and was taken for one (its top-k then unknown: the trace refused the model). A forward whose code cannot be
    read is taken to pick."""
    holders = (parent, getattr(parent, "config", None))
    if any(isinstance(getattr(h, a, None), int) for h in holders if h is not None for a in _TOP_K_NAMES):
        return True
    try:
        code = inspect.getsource(type(parent).forward)
    except (OSError, TypeError):
        return True
    return any(pick in code for pick in _PICKS)


def _router(parent: nn.Module, experts: int) -> str | None:
    """The child whose weight maps the hidden state to one logit per expert."""
    for name, child in parent.named_children():
        weight = getattr(child, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[0] == experts:
            return name
    return None


def _layer(name, module, experts, records, routing, seen, tokens, blocks) -> MoELayer:
    experts_name, experts_module = experts
    count = experts_module.num_experts if is_hf_experts(experts_module) else len(experts_module)
    params = dict(experts_module.named_parameters())
    router = _router(module, count)
    shared = next((s for s in _SHARED_NAMES if isinstance(getattr(module, s, None), nn.Module)), None)
    router_weight = getattr(module, router).weight if router else None
    hidden, ffn, gated = _ffn_shape(experts_module, router_weight.shape[1] if router_weight is not None else None)
    traced_tokens = seen.get(experts_name, tokens)
    top_k = _top_k(name, module, router, records)
    return MoELayer(
        module=name,
        experts_module=experts_name,
        layer=next((b for b in blocks if within(name, b)), None),
        num_experts=count,
        top_k=top_k,
        hidden_size=hidden,
        expert_ffn_size=ffn,
        expert_param_names=[f"{experts_name}.{p}" for p in params],
        params_per_expert=sum(p.numel() for p in params.values()) // count,
        router_module=f"{name}.{router}" if router else None,
        shared_module=f"{name}.{shared}" if shared else None,
        shared_params=sum(p.numel() for p in getattr(module, shared).parameters()) if shared else 0,
        gated=gated,
        tokens=traced_tokens,
        slots_per_expert=_slots(experts_name, experts_module, routing, traced_tokens, top_k, records),
        routing=routing,
        interface="grouped" if is_hf_experts(experts_module) else "module_list",
    )


def _ffn_shape(experts: nn.Module, hidden: int | None) -> tuple[int, int, bool]:
    """(hidden, one expert's FFN width, gated) from the experts' down projection: the one that
    maps back to the hidden size the router reads (``hidden``; without a router, the last linear)."""
    if is_hf_experts(experts):
        down = experts.down_proj.shape  # [E, H, I], or [E, I, H] when transposed
        hidden, ffn = (down[2], down[1]) if experts.is_transposed else (down[1], down[2])
        return int(hidden), int(ffn), bool(experts.has_gate)
    linears = [m for m in experts[0].modules() if isinstance(m, nn.Linear)]
    if not linears:
        return 0, 0, False
    down = [m for m in linears if m.out_features == hidden] or linears[-1:]
    return down[-1].out_features, down[-1].in_features, len(linears) > 2


def _slots(name: str, experts: nn.Module, routing: RoutingModel, tokens: int, top_k: int, records: list) -> int:
    """Slots each expert computed in the trace: the routing model's for experts it ran; for
    routing written with static shapes, the rows its first expert's first linear received."""
    if is_hf_experts(experts):
        return routing.slots_per_expert(tokens, top_k, experts.num_experts)
    first = next((r for r in records if within(r.module, name) and r.params), None)
    return int(first.outputs[0].shape[-2]) if first is not None and first.outputs[0].dim() >= 2 else 0


def _top_k(name: str, module: nn.Module, router: str | None, records: list) -> int:
    holders = [module, getattr(module, router, None) if router else None, getattr(module, "config", None)]
    for holder in holders:
        for attr in _TOP_K_NAMES:
            value = getattr(holder, attr, None) if holder is not None else None
            if isinstance(value, int) and value >= 1:
                return value
    picks = [r for r in records if r.op_name.endswith("topk") and within(r.module, name)]
    if picks and picks[-1].node is not None and len(picks[-1].node.args) > 1:
        return int(picks[-1].node.args[1])
    raise TraceError(
        f"MoE layer '{name}': autoplan cannot tell how many experts each token picks (no top_k attribute and "
        f"no topk in its forward); give the module a `top_k` attribute."
    )
