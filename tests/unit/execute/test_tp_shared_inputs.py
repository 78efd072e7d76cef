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


def test_a_plain_buffer_updated_in_place_from_a_dtensor_is_updated_as_on_one_device(tp_mesh):
    """A running statistic (a plain buffer) updated from an activation, a DTensor under tp: DTensor's dispatch
    asserted; execute/dtensor_handlers.py makes the DTensor whole and runs the op on plain tensors."""
    from torch.distributed.tensor import distribute_tensor

    import autoplan.execute.dtensor_handlers  # noqa: F401  (the handlers register on import, as the executor's)

    running, h = torch.zeros(8), torch.randn(4, 8)
    activation = distribute_tensor(h, tp_mesh, [Replicate()])
    with torch.no_grad():
        running.mul_(0.9).add_(0.1 * activation.mean(0))
    assert not isinstance(running, type(activation))
    torch.testing.assert_close(running, 0.1 * h.mean(0))
