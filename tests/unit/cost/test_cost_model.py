"""The cost model against the published formulas of ../shared/reference/COST_MODEL_REFERENCES.md.

The GPT is the cost-model one of tests/synthetic/graphs.py (a nanoGPT block with flash SDPA and dropout,
traced in bf16 so 16-bit activations need no rescaling). Flash attention saves no s^2
tensor, so Korthikanti's 5as/h term does not apply: the checks compare the 34 sbh part.
"""

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost import CostModel, estimate
from autoplan.cost.memory.per_device import model_states
from autoplan.cost.pp.schedule import bubble_fraction, in_flight_chunks
from autoplan.errors import PlanError
from autoplan.types import Plan

S, B, H, A, V = 512, 1, 1024, 16, 4096


def _plan(**kw):
    fields = dict(devices=1, dp=1, tp=1, pp=1, micro_batch_size=B, num_microbatches=1, precision="bf16")
    fields.update(kw)
    fields["devices"] = fields["dp"] * fields["tp"] * fields["pp"]
    return Plan(**fields)


def _per_layer_activation_sbh(**kw):
    """Activation bytes of one block for one micro-batch, in units of s*b*h (two depths differenced), as
    Megatron-LM runs the block: every activation in 16 bits, where autoplan's executor runs bf16 under
    autocast, whose fp32 list keeps CUDA layer norms' outputs fp32 (docs/cost-model.md, "Activation dtypes")."""
    kw.setdefault("runtime", "megatron-lm-2022")
    values = []
    for layers in (2, 4):
        graph = gpt_graph(layers=layers, hidden=H, heads=A, seq_len=S, vocab=V, batch_size=4, dtype_bytes=2)
        values.append(CostModel(graph, a100_profile()).estimate(_plan(**kw)).activations_bytes)
    return (values[1] - values[0]) / 2 / (S * B * H)


def test_activation_memory_no_parallelism_is_34_sbh():
    # Korthikanti et al. 2022 eq. (1): sbh(34 + 5as/h); flash SDPA drops the 5as/h term.
    assert _per_layer_activation_sbh() == pytest.approx(34, rel=0.01)
    # autoplan's executor runs bf16 under CUDA autocast, which computes layer_norm in fp32 (its fp32 list),
    # but each norm's one reader, a linear, saves its own bf16 copy of it: the same 34 sbh
    assert _per_layer_activation_sbh(runtime="autoplan") == pytest.approx(34, rel=0.01)


def test_full_recompute_keeps_only_the_block_input():
    # Korthikanti et al. 2022 section 4.3: 2sbh per layer (16-bit), and 2sbh/t under SP.
    assert _per_layer_activation_sbh(recompute="full") == pytest.approx(2, rel=0.01)
    assert _per_layer_activation_sbh(recompute="full", tp=4, sequence_parallel=True) == pytest.approx(0.5, rel=0.01)


def test_selective_recompute_keeps_the_block_input_and_matmul_outputs():
    # Selective = keep the outputs of matmuls and attention, re-run the rest (cost/blocks.py):
    # block input 2 + qkv 6 + attention output 2 + projection 2 + fc1 8 + fc2 2 = 22 sbh (16-bit).
    assert _per_layer_activation_sbh(recompute="selective") == pytest.approx(22, rel=0.01)


def test_activation_memory_tensor_parallel_is_10_plus_24_over_t():
    # Korthikanti et al. 2022 eq. (2): sbh(10 + 24/t + 5as/(ht)).
    assert _per_layer_activation_sbh(tp=4) == pytest.approx(10 + 24 / 4, rel=0.02)


def test_activation_memory_tensor_and_sequence_parallel_is_34_over_t_plus_the_gathered_inputs():
    # Korthikanti et al. 2022 eq. (4) is sbh * 34 / t: Megatron keeps the sequence shard of the
    # two LayerNorm outputs and all-gathers them again in the backward. The executor keeps the
    # gathered copy its linears save instead (cost/tp/memory.py), 2 x 2sbh (1 - 1/t) more.
    assert _per_layer_activation_sbh(tp=4, sequence_parallel=True) == pytest.approx(34 / 4 + 4 * (1 - 1 / 4), rel=0.02)


@pytest.mark.parametrize("stage, expected", [(0, 4 + 2 + 4 + 8), (1, 4 + 2 + 4 + 12 / 8), (2, 2 + 16 / 8), (3, 16 / 8)])
def test_zero_model_states_are_what_the_executor_holds(stage, expected):
    # cost/memory/per_device.py: fp32 weights (+ autocast's bf16 copy) and gradients, AdamW moments; ZeRO-1 a
    # 1/N fp32 master slice; FSDP2 fp32 shards (16/N, Rajbhandari et al. SC'20), ZeRO-2 with the bf16
    # weights gathered for the step.
    states = model_states(params=1e9, precision="bf16", zero_stage=stage, dp=8)
    total = states.weights_bytes + states.grads_bytes + states.optimizer_bytes
    assert total == pytest.approx(expected * 1e9)


def test_zero_stage_three_shrinks_cost_model_states():
    graph = gpt_graph(layers=4, hidden=H, heads=A, seq_len=S, vocab=V, batch_size=8)
    model = CostModel(graph, a100_profile())
    plain = model.estimate(_plan(dp=8, num_microbatches=1))
    sharded = model.estimate(_plan(dp=8, num_microbatches=1, zero_stage=3))
    assert plain.optimizer_bytes == pytest.approx(8 * graph.param_count, rel=1e-6)  # AdamW's fp32 moments
    assert sharded.weights_bytes == pytest.approx(4 * graph.param_count / 8, rel=1e-6)  # fp32 shards
    assert sharded.zero_comm_s > 0 and sharded.dp_comm_s == 0


@pytest.mark.parametrize(
    "schedule, v, expected", [("1f1b", 1, 3 / 8), ("gpipe", 1, 3 / 8), ("interleaved_1f1b", 2, 3 / 16)]
)
def test_bubble_is_p_minus_1_over_v_m(schedule, v, expected):
    # Narayanan et al. SC'21 section 2.2: (p-1)/m, interleaved (p-1)/(v m).
    assert bubble_fraction(pp=4, num_microbatches=8, virtual_stages=v) == pytest.approx(expected)
    graph = gpt_graph(layers=8, hidden=H, heads=A, seq_len=S, vocab=V, batch_size=8)
    cost = CostModel(graph, a100_profile()).estimate(
        _plan(pp=4, num_microbatches=8, schedule=schedule, virtual_stages=v)
    )
    ideal = cost.compute_s + cost.tp_comm_s
    assert cost.bubble_s / ideal == pytest.approx(expected, rel=0.15)  # stage imbalance: head on the last stage


def test_in_flight_micro_batches_per_schedule():
    assert in_flight_chunks(_plan(pp=4, num_microbatches=8), 0) == 4
    assert in_flight_chunks(_plan(pp=4, num_microbatches=8), 3) == 1
    assert in_flight_chunks(_plan(pp=4, num_microbatches=8, schedule="gpipe"), 3) == 8
    inter = _plan(pp=4, num_microbatches=8, schedule="interleaved_1f1b", virtual_stages=2)
    assert in_flight_chunks(inter, 0) == pytest.approx(4 * (1 + 3 / 8))  # Korthikanti 4.2.3


def test_megatron_tp_volume_is_four_all_reduces_of_bsh_per_layer():
    # Shoeybi et al. 2019: 2 all-reduces of b*s*h in the forward and 2 in the backward per layer.
    profile = a100_profile()
    graph = gpt_graph(layers=4, hidden=H, heads=A, seq_len=S, vocab=V, batch_size=1, dtype_bytes=2)
    model = CostModel(graph, profile)
    from autoplan.cost.network.comm import collective_time_s
    from autoplan.cost.network.mesh import AxisGroup

    one = collective_time_s(profile, "all_reduce", S * B * H * 2, group=AxisGroup(size=4, ranks_per_node=4))
    block = model.block_summary("h.1", model._tp_plan(_plan(tp=4)), _ctx(model, tp=4))
    assert block.tp_fwd_s == pytest.approx(2 * one, rel=0.01)
    assert block.tp_fwd_s + block.tp_bwd_s == pytest.approx(4 * one, rel=0.01)


def _ctx(model, *, tp):
    from autoplan.cost.network.mesh import mesh_groups
    from autoplan.cost.tp.splits import TPContext

    group = mesh_groups(model.profile, dp=1, tp=tp, pp=1)["tp"]
    return TPContext(
        profile=model.profile,
        tp=tp,
        group=group,
        sequence_parallel=False,
        precision="bf16",
        batch_fraction=B / model.graph.batch_size,
    )


def test_transformer_flops_match_narayanan_eq3():
    # Narayanan et al. SC'21 eq. (3): 72 B s l h^2 (1 + s/(6h)) for the blocks and 6 B s h V for the
    # head without recomputation; full recomputation adds one forward of each block (96 instead of 72).
    layers, batch = 4, 8
    graph = gpt_graph(layers=layers, hidden=H, heads=A, seq_len=S, vocab=V, batch_size=batch)
    cost = CostModel(graph, a100_profile()).estimate(_plan(dp=8, micro_batch_size=1, recompute="full"))
    blocks = 72 * batch * S * layers * H**2 * (1 + S / (6 * H))
    head = 6 * batch * S * H * V
    assert cost.extra["model_flops"] == pytest.approx(blocks + head, rel=0.01)
    assert cost.extra["hardware_flops"] == pytest.approx(blocks * 96 / 72 + head, rel=0.01)


def test_topology_tp_inside_node_beats_tp_spanning_nodes():
    # With tp innermost, tp=8 stays on NVLink; a (pp=1, dp=2, tp=16) mesh makes tp span two nodes.
    graph = gpt_graph(layers=4, hidden=2048, heads=16, seq_len=S, vocab=V, batch_size=16)
    model = CostModel(graph, a100_profile(inter_busbw=100e9))
    inside = model.estimate(_plan(dp=2, tp=8, num_microbatches=8))
    across = model.estimate(_plan(dp=1, tp=16, num_microbatches=16))
    assert inside.tp_comm_s / 8 < across.tp_comm_s / 16


def test_monotonic_more_devices_less_compute_per_device():
    graph = gpt_graph(layers=8, hidden=H, heads=A, seq_len=S, vocab=V, batch_size=16)
    model = CostModel(graph, a100_profile())
    one = model.estimate(_plan(dp=1, num_microbatches=16))
    four = model.estimate(_plan(dp=4, num_microbatches=4))
    assert four.compute_s < one.compute_s / 3.5
    assert four.samples_per_s > one.samples_per_s
    assert four.dp_comm_s > 0 and one.dp_comm_s == 0
    tp2 = model.estimate(_plan(tp=2, num_microbatches=16))
    assert tp2.compute_s < one.compute_s and tp2.weights_bytes < one.weights_bytes


def test_recompute_trades_time_for_memory():
    graph = gpt_graph(layers=8, hidden=H, heads=A, seq_len=S, vocab=V, batch_size=8)
    model = CostModel(graph, a100_profile())
    none, full = (model.estimate(_plan(num_microbatches=8, recompute=rc)) for rc in ("none", "full"))
    assert full.step_time_s > none.step_time_s and full.activations_bytes < none.activations_bytes
    assert full.recompute_s > 0 and none.recompute_s == 0


def test_dp_sync_overlaps_with_backward_but_not_fully():
    graph = gpt_graph(layers=8, hidden=H, heads=A, seq_len=S, vocab=V, batch_size=8)
    cost = CostModel(graph, a100_profile(inter_busbw=50e9)).estimate(_plan(dp=16, num_microbatches=1))
    assert 0 < cost.dp_comm_exposed_s < cost.dp_comm_s


def test_infeasible_plan_says_why_and_throughput_fields_are_set():
    graph = gpt_graph(layers=8, hidden=4096, heads=32, seq_len=2048, vocab=V, batch_size=64)
    profile = a100_profile(price=2.0)
    cost = estimate(graph, profile, _plan(micro_batch_size=64, num_microbatches=1))
    assert not cost.feasible and "GiB per device" in cost.reason
    ok = estimate(graph, profile, _plan(dp=8, micro_batch_size=1, num_microbatches=8, recompute="full"))
    assert ok.feasible and ok.tokens_per_s == pytest.approx(ok.samples_per_s * 2048)
    assert 0 < ok.mfu < 1 and ok.cost_per_step_usd == pytest.approx(2.0 * 8 * ok.step_time_s / 3600)


def test_bad_stages_are_rejected():
    graph = gpt_graph(layers=4)
    model = CostModel(graph, a100_profile())
    with pytest.raises(PlanError, match="leave out block 'h.3'"):
        model.estimate(_plan(pp=2, stages=[["h.0"], ["h.1", "h.2"]]))
    with pytest.raises(PlanError, match="does not have"):
        model.estimate(_plan(pp=2, stages=[["h.0", "h.1"], ["h.2", "x"]]))
