"""Context parallelism's pieces in one process (autoplan/execute/context_parallel.py, cp_attention.py):
the head-tail positions against torch's own balancer, which tensors a block's pre-hook shards and
along which dim, the one-sentence refusal of a shard meeting a whole sequence, and the CUDA path's
calls into torch's CP API (no GPU here: its arguments are checked, as rank 0 of a fake 2-rank group).
The real runs, against the single-process reference: tests/dist/test_execute.py ("cp2_...")."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental import _attention
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.errors import PlanError, RunError
from autoplan.execute import context_parallel as cpx
from autoplan.execute import cp_attention
from autoplan.execute.data_parallel import dp_mode
from autoplan.types.plan import Plan


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_head_tail_positions_are_torch_balancers_chunks(cp):
    seq_len = 8 * cp
    theirs = _attention._HeadTailLoadBalancer(seq_len, cp, "cpu")._generate_indices()[0].view(cp, -1)
    for rank in range(cp):
        mine = cpx.head_tail_positions(seq_len=seq_len, cp=cp, rank=rank)
        assert mine.tolist() == theirs[rank].tolist()
    assert cpx.head_tail_positions(seq_len=8, cp=2, rank=0).tolist() == [0, 1, 6, 7]


@pytest.mark.parametrize(
    ("shape", "dim"),
    [
        ((2, 8, 32), 1),  # hidden states [B, S, H]
        ((2, 8, 8), 1),  # H == S: still the sequence dim of a batched tensor
        ((2, 4, 8), None),  # already a shard (S/cp = 4): a later block's hidden states
        ((1, 8, 1, 4), 1),  # a rotary table broadcast over batch and heads
        ((8, 4), 0),  # a rotary table [S, D]
        ((8, 8), 0),  # [S, D] with D == S: the first dim
        ((4, 4), None),  # no sequence
        ((2, 1, 8, 8), None),  # a mask over the whole sequence's scores (Hugging Face's): whole, attention slices it
        ((1, 1, 8, 8), None),  # the same broadcast over the batch
        ((2, 1, 1, 8), None),  # a key-padding mask broadcast over the queries
        ((1, 8), 1),  # position ids [1, S]: a block takes its shard
        ((1, 8, 8), 1),  # 3-D: no mask as SDPA takes one ([B, H, L, S])
        ((1, 8, 1, 8), 1),  # a rotary table [1, S, 1, D] whose D equals S: its dim 1 is the sequence
    ],
)
def test_sequence_dim_is_dim_1_of_a_batched_tensor_else_the_first_of_length_s(shape, dim):
    assert cpx.sequence_dim(shape, seq_len=8, batch=2) == dim


def test_a_block_input_shard_keeps_this_ranks_positions_of_each_sequence_long_argument():
    positions = cpx.head_tail_positions(seq_len=8, cp=2, rank=1)  # chunks 1 and 2: tokens 2, 3, 4, 5
    hidden, rotary, shard = torch.arange(2 * 8 * 3).view(2, 8, 3), torch.arange(8 * 4).view(8, 4), torch.ones(2, 4, 3)
    args = (hidden, {"cos": rotary, "scale": 0.5}, [shard])
    out = cpx.shard_sequence(args, positions=positions, seq_len=8, batch=2)
    assert torch.equal(out[0], hidden[:, 2:6]) and torch.equal(out[1]["cos"], rotary[2:6])
    assert out[1]["scale"] == 0.5 and out[2][0] is shard


@pytest.fixture
def fake_cp_rank_0_of_2():
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    yield cpx.ContextParallel(
        cp_mesh=mesh, seq_len=16, micro_batch_size=2, variant="ring", backend="gloo", kv_group=mesh.get_group()
    )
    dist.destroy_process_group()


def test_a_shard_meeting_a_whole_sequence_is_one_sentence(fake_cp_rank_0_of_2):
    cp = fake_cp_rank_0_of_2
    meeting = RuntimeError("The size of tensor a (8) must match the size of tensor b (16) at non-singleton dimension 1")
    refused = cp.refusal(meeting)
    assert isinstance(refused, PlanError) and "8 of 16 tokens per cp rank" in str(refused)
    assert "plan cp=1" in str(refused)
    other = RuntimeError("The size of tensor a (3) must match the size of tensor b (16) at non-singleton dimension 1")
    assert cp.refusal(other) is None


def test_ulysses_on_heads_cp_does_not_divide_is_one_sentence(fake_cp_rank_0_of_2):
    cp = fake_cp_rank_0_of_2
    cp.variant = "ulysses"
    q, kv = torch.randn(1, 4, 8, 4), torch.randn(1, 1, 8, 4)  # 4 query heads, 1 key/value head
    with pytest.raises(PlanError, match=r"splits attention heads over cp=2, .* 4 query and 1 key/value heads"):
        cp.attention(
            query=q, key=kv, value=kv, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None, enable_gqa=True
        )


def test_a_mask_made_inside_a_block_or_for_ring_attention_is_one_sentence(fake_cp_rank_0_of_2):
    """cp applies a mask over the whole sequence made before the blocks, through autoplan's all-gather or Ulysses;
    one made from a block's shard ([.., S/cp, S/cp]), or one handed to torch's ring attention, is refused."""
    cp = fake_cp_rank_0_of_2
    with pytest.raises(PlanError, match="ring attention cannot apply the explicit mask.*cp_variant=allgather"):
        cp.check_mask(torch.ones(2, 1, 16, 16, dtype=torch.bool))
    cp.variant = "allgather"
    cp.check_mask(torch.ones(2, 1, 16, 16, dtype=torch.bool))
    cp.check_mask(torch.zeros(2, 1, 1, 16))
    with pytest.raises(PlanError, match=r"got one of shape \[2, 1, 8, 8\] \(made inside a block"):
        cp.check_mask(torch.ones(2, 1, 8, 8, dtype=torch.bool))


def test_allgather_attention_takes_the_rows_of_the_ranks_two_chunks_of_a_whole_mask():
    """Rank r's queries are chunks r and 2cp-1-r: their rows of the mask, every key's column."""
    mask = torch.arange(8 * 8).view(1, 1, 8, 8)
    rows = cp_attention._rows_of(mask, cp=2, rank=1)  # chunks 1 and 2 of 4: queries 2..5
    assert torch.equal(rows, mask[..., 2:6, :])
    assert torch.equal(cp_attention._rows_of(mask, cp=2, rank=0), mask[..., [0, 1, 6, 7], :])
    broadcast = torch.zeros(2, 1, 1, 8)
    assert cp_attention._rows_of(broadcast, cp=2, rank=1) is broadcast
    assert cp_attention.mask_of_heads(mask, heads=4) is mask
    with pytest.raises(PlanError, match="per-head mask of 8 heads to attention over 4 heads"):
        cp_attention.mask_of_heads(torch.ones(2, 8, 8, 8), heads=4)


def test_cuda_path_runs_torchs_cp_sdpa_on_sequence_sharded_dtensors(fake_cp_rank_0_of_2, monkeypatch):
    cp, seen = fake_cp_rank_0_of_2, {}

    def torch_sdpa(q, k, v, **kwargs):
        seen.update(operands=(q, k, v), kwargs=kwargs)
        return q

    monkeypatch.setattr(cp_attention.F, "scaled_dot_product_attention", torch_sdpa)
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    out = cp_attention.torch_cp_attention(q, k, v, cp_mesh=cp.cp_mesh, is_causal=True, scale=0.25, enable_gqa=True)
    for operand, local in zip(seen["operands"], (q, k, v)):
        assert isinstance(operand, DTensor) and operand.placements == (Shard(2),)
        assert operand.device_mesh == cp.cp_mesh and torch.equal(operand.to_local(), local)
    assert seen["kwargs"] == {"dropout_p": 0.0, "is_causal": True, "scale": 0.25, "enable_gqa": True}
    assert not isinstance(out, DTensor) and torch.equal(out, q)


def test_cuda_path_enables_torchs_dispatcher_and_refuses_another_balancing(fake_cp_rank_0_of_2, monkeypatch):
    cp, calls = fake_cp_rank_0_of_2, []
    monkeypatch.setattr(_attention, "set_rotate_method", lambda method: calls.append(("rotate", method)))
    monkeypatch.setattr(_attention, "_enable_context_parallel_dispatcher", lambda: calls.append(("dispatcher",)))

    def shard(mesh, buffers, seq_dims, load_balancer):
        calls.append(("shard", mesh, buffers[0].tolist(), seq_dims, type(load_balancer)))
        indices = load_balancer._generate_indices()[0].view(cp.cp, -1)[cp.rank]
        return [buffers[0][indices]]

    monkeypatch.setattr(_attention, "_context_parallel_shard", shard)
    cpx.enable_torch_cp(cp)
    assert calls == [
        ("rotate", "alltoall"),  # the ring variant passes KV round the group
        ("dispatcher",),
        ("shard", cp.cp_mesh, list(range(16)), [0], _attention._HeadTailLoadBalancer),
    ]
    monkeypatch.setattr(_attention, "_context_parallel_shard", lambda *a, **k: [torch.arange(8)])
    with pytest.raises(RunError, match="not chunks r and 2cp-1-r"):
        cpx.enable_torch_cp(cp)


@pytest.mark.parametrize(
    ("degrees", "mode"),
    [
        (dict(cp=2), "ddp"),  # the dp x cp ranks sync with DDP, as the cost model prices (no flat copy)
        (dict(cp=2, zero_stage=3), "fsdp"),
        (dict(cp=2, tp=2), "allreduce"),
        (dict(cp=2, dp=2, zero_stage=1), "zero1"),
        ({}, "none"),
    ],
)
def test_gradients_sync_over_dp_x_cp(degrees, mode):
    degrees = {"dp": 1, "cp": 1, "tp": 1, **degrees}
    devices = degrees["dp"] * degrees["cp"] * degrees["tp"]
    plan = Plan(devices=devices, pp=1, micro_batch_size=1, num_microbatches=1, **degrees)
    assert dp_mode(plan=plan) == mode


def test_a_cp_plan_this_machine_cannot_run_stops_before_any_rank_starts():
    from autoplan.execute.tp_overlap import check_runs_here
    from autoplan.types.inputs import InputSpec

    tokens = [InputSpec(kind="tensor", shape=[2, 18], dtype="int64", batched=True)]
    plan = dict(devices=2, dp=1, cp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=1)
    with pytest.raises(PlanError, match=r"^plan cp_variant='ring' does not run on gloo here \(it runs: allgather"):
        check_runs_here(Plan(**plan, cp_variant="ring"))
    with pytest.raises(PlanError, match=r"^plan cp=2: 18 tokens do not split into 4 equal chunks\.$"):
        check_runs_here(Plan(**plan, inputs=tokens))
    check_runs_here(Plan(**{**plan, "cp": 1, "dp": 2}, inputs=tokens))  # 18 tokens are fine at cp = 1
