"""mesh groups, collective times and op times: the three primitives the planner codes against."""

import math

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost.compute.roofline import op_time_s, peak_dtype
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup, mesh_groups
from autoplan.errors import AutoplanError, PlanError
from autoplan.types.profile import OpTiming, bus_factor


def test_tp_innermost_keeps_tp_in_a_node_and_dp_spans():
    groups = mesh_groups(a100_profile(), dp=4, tp=8, pp=2)
    assert groups["tp"] == AxisGroup(size=8, ranks_per_node=8) and not groups["tp"].spans_nodes
    assert groups["dp"] == AxisGroup(size=4, ranks_per_node=1) and groups["dp"].spans_nodes
    assert groups["pp"] == AxisGroup(size=2, ranks_per_node=1)


def test_small_mesh_stays_in_one_node():
    groups = mesh_groups(a100_profile(), dp=2, tp=2, pp=2)
    assert all(not g.spans_nodes for g in groups.values())
    assert groups["dp"].ranks_per_node == 2


def test_tp_larger_than_node_spans_and_irregular_tp_takes_worst_group():
    assert mesh_groups(a100_profile(), dp=1, tp=16, pp=1)["tp"] == AxisGroup(size=16, ranks_per_node=8)
    # tp=3 on 8-GPU nodes: the group {6, 7, 8} straddles two nodes with one rank on the second.
    assert mesh_groups(a100_profile(), dp=8, tp=3, pp=1)["tp"] == AxisGroup(size=3, ranks_per_node=1)


def test_mesh_rejects_bad_degree():
    with pytest.raises(PlanError, match="tp=0"):
        mesh_groups(a100_profile(), dp=1, tp=0, pp=1)


def test_collective_matches_alpha_beta_busbw_inside_a_node():
    profile = a100_profile(intra_busbw=200e9)
    group = AxisGroup(size=8, ranks_per_node=8)
    size = 1e9
    assert collective_time_s(profile, "all_reduce", size, group=group) == pytest.approx(
        10e-6 + 2 * 7 / 8 * size / 200e9
    )
    assert collective_time_s(profile, "all_gather", size, group=group) == pytest.approx(10e-6 + 7 / 8 * size / 200e9)
    assert collective_time_s(profile, "all_reduce", size, group=AxisGroup(1, 1)) == 0.0
    assert bus_factor("send_recv", 2) == 1.0


def test_spanning_collective_scales_node_bandwidth_by_rails_used():
    profile = a100_profile(inter_busbw=200e9, intra_busbw=230e9)
    size = 1e9
    one_rail = collective_time_s(profile, "all_reduce", size, group=AxisGroup(size=4, ranks_per_node=1))
    all_rails = collective_time_s(profile, "all_reduce", size, group=AxisGroup(size=32, ranks_per_node=8))
    assert one_rail == pytest.approx(20e-6 * 2 + 2 * 3 / 4 * size / (200e9 / 8))
    # NIC bound (2*31/32 / 200 GB/s) beats the NVLink level (2*7/8 / 230 GB/s), plus both latencies.
    assert all_rails == pytest.approx(10e-6 + 20e-6 * 2 + 2 * 31 / 32 * size / 200e9)


def test_tp_inside_node_beats_tp_across_nodes_when_inter_is_slower():
    profile = a100_profile()
    inside = collective_time_s(profile, "all_reduce", 64e6, group=AxisGroup(size=8, ranks_per_node=8))
    across = collective_time_s(profile, "all_reduce", 64e6, group=AxisGroup(size=8, ranks_per_node=4))
    assert inside < across


def test_send_recv_uses_one_rail_across_nodes():
    profile = a100_profile(inter_busbw=200e9)
    t = collective_time_s(profile, "send_recv", 25e6, group=AxisGroup(size=2, ranks_per_node=1))
    assert t == pytest.approx(20e-6 + 25e6 / 25e9)


def test_unknown_collective_is_rejected():
    with pytest.raises(AutoplanError, match="collective kind 'broadcast'"):
        collective_time_s(a100_profile(), "broadcast", 1.0, group=AxisGroup(2, 2))


def test_op_time_is_flops_bound_for_big_matmul_and_memory_bound_for_elementwise():
    graph = gpt_graph(hidden=4096, heads=32, seq_len=2048, batch_size=8, layers=1)
    profile = a100_profile()
    fc = graph.node("h.0.mlp.c_fc")
    t = op_time_s(fc, profile, precision="bf16", batch_fraction=1.0)
    eff = profile.device.efficiency["matmul"](fc.fwd_flops)
    assert t == pytest.approx(fc.fwd_flops / (312e12 * eff))
    gelu = graph.node("h.0.mlp.gelu")
    t_gelu = op_time_s(gelu, profile, precision="bf16", batch_fraction=1.0)
    assert t_gelu == pytest.approx(2 * gelu.output_bytes / 2 / (2.039e12 * 0.8))
    assert op_time_s(gelu, profile, precision="fp32", batch_fraction=1.0) == pytest.approx(2 * t_gelu)


def test_op_time_scales_with_batch_shard_and_backward():
    graph = gpt_graph(hidden=4096, heads=32, seq_len=2048, batch_size=8, layers=1)
    profile = a100_profile()
    fc = graph.node("h.0.mlp.c_fc")
    full = op_time_s(fc, profile, precision="bf16", batch_fraction=1.0)
    assert op_time_s(fc, profile, precision="bf16", batch_fraction=0.5, shard=2) < full / 3.9
    assert op_time_s(fc, profile, precision="bf16", batch_fraction=1.0, backward=True) == pytest.approx(
        2 * full, rel=0.01
    )
    assert op_time_s(fc, profile, precision="fp32", batch_fraction=1.0) > 10 * full


def test_measured_op_table_wins():
    graph = gpt_graph(hidden=256, heads=8, seq_len=128, batch_size=8, layers=1)
    profile = a100_profile()
    profile.device.op_table.append(OpTiming(op="linear", shape="m=1024,n=1024,k=256", dtype="bf16", time_s=1e-3))
    fc = graph.node("h.0.mlp.c_fc")
    assert op_time_s(fc, profile, precision="bf16", batch_fraction=1.0) == 1e-3
    assert op_time_s(fc, profile, precision="bf16", batch_fraction=1.0, backward=True) == pytest.approx(2e-3)


def test_peak_dtype_falls_back_and_rejects_missing():
    profile = a100_profile()
    assert peak_dtype(profile, "fp32") == "fp32" and peak_dtype(profile, "fp16") == "fp16"
    del profile.device.peak_flops["fp16"]
    assert peak_dtype(profile, "fp16") == "bf16"
    del profile.device.peak_flops["bf16"]
    with pytest.raises(PlanError, match="no peak FLOP/s for bf16"):
        peak_dtype(profile, "bf16")


def test_ring_only_collectives_pay_a_hop_per_rank_across_nodes_and_all_reduce_a_tree():
    """NCCL runs all-gather and reduce-scatter as rings (n - 1 hops, N - 1 over a NIC), all-reduce
    as a tree at scale (log2 N): the start-up of a tiny message shows which (cost/network/comm.py)."""
    profile = a100_profile()
    intra, inter = profile.intra_node.collectives, profile.inter_node.collectives
    for n in (384, 1536):
        group, nodes = AxisGroup(size=n, ranks_per_node=8), n // 8
        ring = intra["all_gather"].alpha_s / 7 * (n - nodes) + inter["all_gather"].alpha_s * (nodes - 1)
        assert collective_time_s(profile, "all_gather", 1.0, group=group) == pytest.approx(ring, rel=1e-3)
        tree = intra["all_reduce"].alpha_s + inter["all_reduce"].alpha_s * math.ceil(math.log2(nodes))
        assert collective_time_s(profile, "all_reduce", 1.0, group=group) == pytest.approx(tree, rel=1e-3)
    one_per_node = AxisGroup(size=64, ranks_per_node=1)  # PAT, not a ring: logarithmic
    assert collective_time_s(profile, "all_gather", 1.0, group=one_per_node) == pytest.approx(
        inter["all_gather"].alpha_s * 6, rel=1e-3
    )


def test_dp_messages_are_bucketed_only_under_ddp():
    """DDP sends 25 MiB buckets, each paying its start-up; FSDP units and ZeRO-1's flat buffer are
    one call each, as the audit counts them (cost/volumes.py)."""
    from autoplan.cost.dp.messages import GRADS, dp_messages, find
    from autoplan.cost.memory.per_device import DDP_BUCKET_BYTES
    from autoplan.cost.model import CostModel
    from autoplan.types.plan import Plan

    profile, size = a100_profile(), 40 * DDP_BUCKET_BYTES
    model = CostModel(gpt_graph(), profile)
    group = AxisGroup(size=64, ranks_per_node=8)
    ddp = Plan(devices=64, dp=64, tp=1, pp=1, micro_batch_size=1, num_microbatches=1)
    fsdp = Plan(devices=64, dp=64, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, zero_stage=3)
    one = collective_time_s(profile, "reduce_scatter", size, group=group)
    bucket = collective_time_s(profile, "all_reduce", DDP_BUCKET_BYTES, group=group)
    (grads,) = dp_messages(ddp)
    scatter = find(dp_messages(fsdp), GRADS)
    assert model.dp_terms.message_s(grads, size, group) == pytest.approx(40 * bucket)
    assert model.dp_terms.message_s(scatter, size, group) == pytest.approx(one)


def test_a_view_of_a_parameter_and_a_metadata_assert_move_nothing():
    """w.T feeding a matmul is a view: the matmul reads the weight, the view costs nothing (an
    expert's [E, H, I] weight transposed for a bmm once cost a full read of every expert); an
    op with no tensor output (aten._assert_tensor_metadata) reads nothing either."""
    from autoplan.types.graph import OpNode

    profile = a100_profile()
    view = OpNode(
        name="t", op="view", target="aten.transpose.int", module="experts", layer=None,
        param_names=["experts.w"], param_count=256 * 7168 * 4096, output_shape=[256, 4096, 7168],
        output_dtype="torch.float32", output_bytes=4 * 256 * 7168 * 4096,
    )  # fmt: skip
    check = OpNode(name="a", op="other", target="aten._assert_tensor_metadata.default", module="m", layer=None)
    for node in (view, check):
        for backward in (False, True):
            assert op_time_s(node, profile, precision="bf16", batch_fraction=1.0, backward=backward) == 0.0


@pytest.mark.parametrize(
    ("transient", "scatter", "sync", "after", "persist", "at_peak"),
    [
        (5.0, 0.0, 0.0, 1, False, (100, 0, 200, 125, 2)),  # M1: the forward's end, no gradients yet
        (5.0, 0.0, 0.0, 3, False, (100, 50, 200, 95, 2)),  # M2: a later backward
        (1.0, 40.0, 0.0, 3, False, (100, 50, 200, 80, 42)),  # M2: a block's scatter beside its freed activations
        (0.0, 0.0, 500.0, 3, False, (100, 50, 200, 0, 500)),  # M3: the sync buffer after the backward
        # a tie peaks at the first moment of M1, M2, M3 (per_device.stage_memory builds only that one)
        (0.0, 0.0, 0.0, 4, True, (100, 50, 200, 120, 2)),  # M1 = M2 = 172: M1's parts
        (0.0, 0.0, 122.0, 4, False, (100, 50, 200, 120, 2)),  # M2 = M3 = 172, M1 = 122: M2's parts
        (0.0, 20.0, 132.0, 4, False, (100, 50, 200, 110, 22)),  # M2 freeing its block = M3 = 182: M2's scatter
        (0.0, 0.0, 172.0, 1, False, (100, 50, 200, 0, 172)),  # M3 = 222 alone the largest
    ],
)
def test_the_peak_moment_splits_into_parts_that_sum_to_the_peak(transient, scatter, sync, after, persist, at_peak):
    """memory.png draws at_peak_bytes (report/memory.py): the moment itself, not each part's maximum."""
    from autoplan.cost.memory.per_device import ModelStates, stage_memory

    memory = stage_memory(
        states=ModelStates(weights_bytes=100.0, grads_bytes=50.0, optimizer_bytes=200.0),
        saved_bytes=30.0,
        transient_bytes=transient,
        in_flight=4,
        in_flight_after=after,
        last_block_bytes=10.0,
        buffers_bytes=2.0,
        scatter_bytes=scatter,
        sync_bytes=sync,
        grads_persist=persist,
    )
    assert memory.at_peak_bytes == pytest.approx(at_peak)
    assert sum(memory.at_peak_bytes) == pytest.approx(memory.peak_bytes)
