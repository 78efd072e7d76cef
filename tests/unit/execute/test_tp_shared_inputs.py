"""tensor_parallel.SharedInputs hands every reader of one input the same redistributed tensor, once per autograd
pass and grad mode: a linear run under torch.no_grad() first must not leave the next reader an input without its
graph (a pinned tp=2 trained a gated block 30-47% off its gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate

from autoplan.execute.tensor_parallel import SharedInputs


@pytest.fixture
def tp_mesh():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    dist.destroy_process_group()


def test_an_input_first_read_under_no_grad_keeps_its_graph_for_the_next_reader(tp_mesh):
    inputs, x = SharedInputs(tp_mesh), torch.randn(4, 8, requires_grad=True)
    with torch.no_grad():
        gated = inputs(x, Replicate())
    shared = inputs(x, Replicate())
    assert not gated.requires_grad and shared.requires_grad
    assert inputs(x, Replicate()) is shared  # still one redistribution per grad mode
    (shared.full_tensor() * 3.0).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
