"""The propagator's per-node shortcuts (issue 38) give what the plain computations give."""

from __future__ import annotations

import torch
import torch.nn as nn

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


def test_node_params_finds_every_parameter_once_and_none_where_no_input_is_one():
    """node_params skips the argument walk where no input is a get_attr: those nodes read no parameter, and the
    nodes that do read one find the parameter read directly, each once."""
    model = _Tied()
    with swapped(model, to_meta):
        gm = capture(model, (torch.zeros(2, 4, dtype=torch.long, device="meta"),), model_name="tied").module
    canonical = canonical_names(model)
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    found = {n: [name for name, _ in nodeattrs.node_params(n, gm, None, canonical)] for n in calls}
    reads = [n for n in calls if any(a.op == "get_attr" for a in n.all_input_nodes)]
    assert reads and len(reads) < len(calls)  # both paths are taken
    assert all(found[n] == [] for n in calls if n not in reads)
    assert all(len(found[n]) == len(set(found[n])) for n in reads)
    assert {name for n in reads for name in found[n]} == {"scale"}  # the modules' own weights are call_module's


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
