"""The propagator's per-node shortcuts (issue 38) give what the plain computations give."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from autoplan.trace import nodeattrs
from autoplan.trace.build import canonical_names
from autoplan.trace.capture import capture
from autoplan.trace.tensors import swapped, to_meta


class _Tied(nn.Module):
    """A parameter read directly (a get_attr node), a tied head, and ops that read no parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.up = nn.Linear(8, 16)
        self.head = nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * self.scale
        a, b = self.up(x).split(8, dim=-1)
        x = x + torch.relu(a) * b[..., : x.shape[-1]]
        return self.head(x * self.scale)


def _plain_params(node, gm, canonical):
    """nodeattrs.node_params before its shortcut: every get_attr leaf of the arguments, canonically named."""
    found = []
    for arg in tree_leaves((node.args, node.kwargs)):
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            value = nodeattrs._get_attr(gm, arg.target)
            if isinstance(value, nn.Parameter):
                found.append((arg.target, value))
    seen, unique = set(), []
    for name, tensor in found:
        name = canonical.get(name, name)
        if name not in seen:
            seen.add(name)
            unique.append((name, tensor))
    return unique


def test_node_params_equals_walking_every_argument():
    model = _Tied()
    with swapped(model, to_meta):
        gm = capture(model, (torch.zeros(2, 4, dtype=torch.long, device="meta"),), model_name="tied").module
    canonical = canonical_names(model)
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    with_params = [n for n in calls if any(a.op == "get_attr" for a in n.all_input_nodes)]
    assert with_params and len(with_params) < len(calls)  # both paths are taken
    for node in calls:
        got = [(name, id(t)) for name, t in nodeattrs.node_params(node, gm, None, canonical)]
        assert got == [(name, id(t)) for name, t in _plain_params(node, gm, canonical)], node.name


def _facts(t: torch.Tensor) -> tuple:
    return (
        type(t),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
        t.requires_grad,
        t.is_leaf,
        t.grad_fn,
        isinstance(t, nn.Parameter),
        getattr(t, "_is_param", False),
        t.fake_mode,
    )


def test_fake_parameters_are_what_nn_parameter_makes_of_a_fake():
    """api._faker(parameter=True) makes what ``nn.Parameter(fake(t), t.requires_grad)`` returns, trained or frozen."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autoplan.trace.api import _faker

    weights = [nn.Parameter(torch.empty(3, 5, device="meta")), nn.Parameter(torch.empty(7, device="meta"))]
    weights[1].requires_grad_(False)
    with FakeTensorMode() as mode:
        fake, direct = _faker(mode), _faker(mode, parameter=True)
        for weight in weights:
            assert _facts(direct(weight)) == _facts(nn.Parameter(fake(weight), requires_grad=weight.requires_grad))
            assert direct(weight).untyped_storage().nbytes() == weight.untyped_storage().nbytes()
