"""ZeRO-1 and the explicit all-reduce accumulate into one flat fp32 buffer and reduce it in place
(autoplan/execute/flat_grads.py): the gradients are views of the buffer, the collective reads the
buffer itself (no flat copy), and the cost model prices no flat copy for such plans."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from autoplan.cost.memory.per_device import sync_buffer_bytes
from autoplan.execute.data_parallel import allreduce_grads
from autoplan.execute.flat_grads import allreduce_buffer
from autoplan.execute.zero import ShardedOptimizer
from autoplan.types.plan import Plan


@pytest.fixture
def one_rank_mesh():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    dist.destroy_process_group()


def _model_and_reference(micro_batches: int):
    """A small two-layer model, and its gradients summed over ``micro_batches`` plain backwards."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    inputs = [torch.randn(4, 6) for _ in range(micro_batches)]
    for x in inputs:
        model(x).square().mean().backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return model, inputs, reference


def _backwards(model: nn.Module, inputs: list[torch.Tensor]) -> None:
    for x in inputs:
        model(x).square().mean().backward()


def _captured(monkeypatch, name: str) -> list[torch.Tensor]:
    """The tensors torch.distributed's ``name`` is called on (its input), before it runs."""
    seen, real = [], getattr(dist, name)

    def spy(*args, **kwargs):
        seen.append(args[1] if name == "reduce_scatter_tensor" else args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, name, spy)
    return seen


def test_zero1_accumulates_into_one_buffer_and_reduce_scatters_it_without_a_copy(one_rank_mesh, monkeypatch):
    model, inputs, reference = _model_and_reference(micro_batches=3)
    optimizer = ShardedOptimizer(
        params=list(model.parameters()), optimizer_fn=lambda ps: torch.optim.SGD(ps, lr=0.0), dp_mesh=one_rank_mesh
    )
    sent = _captured(monkeypatch, "reduce_scatter_tensor")
    for _ in range(2):  # the second step starts from a buffer the first step's all-gather wrote into
        optimizer.zero_grad()
        _backwards(model, inputs)
        buffer = optimizer.grads.buffer
        for param, expected in zip(model.parameters(), reference):
            assert param.grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            torch.testing.assert_close(param.grad, expected)
        optimizer.step()
        assert sent[-1] is buffer  # the reduce-scatter read the gradient buffer itself
    torch.testing.assert_close(optimizer.master.grad, torch.cat([g.reshape(-1) for g in reference]))


def test_explicit_allreduce_reduces_the_buffer_in_place_and_leaves_unused_gradients_unset(one_rank_mesh, monkeypatch):
    model, inputs, reference = _model_and_reference(micro_batches=2)
    unused = nn.Parameter(torch.ones(2))
    params = list(model.parameters()) + [unused]
    flat = allreduce_buffer(dense=params, some_unused=False)
    sent = _captured(monkeypatch, "all_reduce")
    _backwards(model, inputs)
    allreduce_grads(params=params, dp_mesh=one_rank_mesh, flat=flat)
    assert sent == [flat.buffer]
    for param, expected in zip(model.parameters(), reference):
        assert param.grad.untyped_storage().data_ptr() == flat.buffer.untyped_storage().data_ptr()
        torch.testing.assert_close(param.grad, expected)
    assert unused.grad is None  # AdamW skips it, as on one device


def test_tensor_parallel_or_possibly_unused_parameters_keep_their_own_gradients():
    assert allreduce_buffer(dense=[nn.Parameter(torch.ones(2))], some_unused=True) is None
    assert allreduce_buffer(dense=[nn.Parameter(torch.ones(2, dtype=torch.bfloat16))], some_unused=False) is None


def _plan(**kw) -> Plan:
    kw = {"dp": 2, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_microbatches": 4, **kw}
    return Plan(devices=kw["dp"] * kw["tp"] * kw["pp"], **kw)


@pytest.mark.parametrize(
    "kw, flat",
    [
        (dict(zero_stage=1), True),
        (dict(overlap_grad_reduce=False), True),
        (dict(pp=2), True),
        (dict(zero_stage=1, tp=2), False),  # DTensor parameters keep DTensor gradients
        (dict(), False),  # DDP's buckets
        (dict(zero_stage=2), False),
        (dict(dp=1, zero_stage=1), False),
    ],
)
def test_the_plan_says_which_executions_hold_flat_gradients(kw, flat):
    assert _plan(**kw).flat_grads is flat


@pytest.mark.parametrize(
    "zero_stage, reduce_bytes, copied_bytes, flat_bytes",
    [
        (1, 4, 4e6 + 4e6 / 2, 4e6 / 2),  # fp32: the flat copy goes, the slice alone stays (4 P / N)
        (1, 2, 2e6 + 2e6 / 2, 2e6 + 2e6 / 2),  # bf16: a cast and its slice either way
        (0, 4, 4e6, 0.0),  # the all-reduce runs on the buffer itself
        (0, 2, 4e6 + 2e6, 2e6),  # its bf16 cast only
    ],
)
def test_flat_gradients_price_no_flat_copy(zero_stage, reduce_bytes, copied_bytes, flat_bytes):
    kw = dict(params=1e6, zero_stage=zero_stage, dp=2, tp=1, pp=2, reduce_bytes=reduce_bytes)
    assert sync_buffer_bytes(**kw, flat=False) == pytest.approx(copied_bytes)
    assert sync_buffer_bytes(**kw, flat=True) == pytest.approx(flat_bytes)


def test_gloo_stages_the_reduce_scatter_input_in_a_copy_of_its_own():
    """gloo's reduce-scatter copies its input (the audit measures it); NCCL reads the buffer in place."""
    kw = dict(params=1e6, zero_stage=1, dp=2, tp=1, pp=1, reduce_bytes=4, flat=True)
    assert sync_buffer_bytes(**kw, staged=True) == pytest.approx(4e6 + 4e6 / 2)
    assert sync_buffer_bytes(**kw, staged=False) == pytest.approx(4e6 / 2)
