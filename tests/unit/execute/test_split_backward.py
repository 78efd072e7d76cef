"""The executor's completion of torch's split backward (autoplan/execute/split_backward.py): B and W as a
zero-bubble stage runs them (torch's parameter groups joined where their backwards share nodes) give the full
backward's weight gradients, also where a stage output depends on weights alone (T5's position bias, sent on
and used in the stage)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from autoplan.execute.split_backward import accumulate_weight_grads, join_sharing_groups, weight_only_roots


class _Stage(nn.Module):
    """A stage sending its activation and a bias made from its own weight, used in it as well."""

    def __init__(self):
        super().__init__()
        self.lin, self.bias, self.alone = nn.Linear(4, 4), nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(4))

    def forward(self, x):
        bias = self.bias * 2
        return self.lin(x) + bias, bias.exp(), self.alone.tanh()


def _grads(*, split: bool, complete: bool = True) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    stage, x = _Stage(), torch.randn(3, 4, requires_grad=True)
    outputs = stage(x)
    output_grads = [torch.randn_like(o) for o in outputs]
    if not split:
        torch.autograd.backward(outputs, output_grads)
    else:
        roots = weight_only_roots(outputs=outputs, output_grads=output_grads, inputs=[x]) if complete else []
        _, groups = stage_backward_input(list(outputs), output_grads, [x], stage.parameters())
        accumulate_weight_grads(roots=roots, weights=stage.parameters())
        stage_backward_weight(stage.parameters(), join_sharing_groups(groups) if complete else groups)
    return {name: p.grad for name, p in stage.named_parameters()}


def test_split_backward_with_weight_only_outputs_gives_the_full_backward():
    full, split = _grads(split=False), _grads(split=True)
    assert set(split) == set(full)
    for name in full:
        torch.testing.assert_close(split[name], full[name], msg=name)


def test_torch_alone_misses_the_weight_only_outputs_gradients():
    """The cause, pinned: a torch that computed these itself would count them twice with the completion."""
    full, torch_only = _grads(split=False), _grads(split=True, complete=False)
    torch.testing.assert_close(torch_only["lin.weight"], full["lin.weight"])
    assert torch_only["alone"] is None  # reaches no intermediate: torch's groups never hold it
    assert not torch.allclose(torch_only["bias"], full["bias"])


def test_only_outputs_no_input_reaches_are_roots():
    x = torch.randn(2, requires_grad=True)
    w = nn.Parameter(torch.randn(2))
    outputs = (x * w, w * 3, (x + 1).detach())
    roots = weight_only_roots(outputs=outputs, output_grads=[torch.ones(2)] * 3, inputs=[x])
    assert [edge.node for edge, _ in roots] == [outputs[1].grad_fn]


class _Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class _SharedBias(_Chain):
    """A bias made from a weight alone and used by both layers: its node lies on two groups' W backwards."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        bias = (self.w * 2).exp()
        return self.b(self.a(x) * bias) * bias


def _group_counts(stage: nn.Module) -> tuple[int, int]:
    x = torch.randn(3, 4, requires_grad=True)
    out = stage(x)
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], stage.parameters())
    return len(groups), len(join_sharing_groups(groups))


def test_only_groups_whose_backwards_share_nodes_are_joined():
    """Joined groups run the input-gradient work between their intermediates again (discarded by torch's
    pins), which the audit's FLOPs catch; groups apart stay apart."""
    assert _group_counts(_Chain()) == (2, 2)
    before, after = _group_counts(_SharedBias())
    assert after < before
