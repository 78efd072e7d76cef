"""Host-side cost terms: per-op dispatch overhead, gradient accumulation over micro-batches,
gradient sync of weights tied across pipeline stages, and fwd+bwd op-table rows."""

from pathlib import Path

import pytest
from synthetic import a100_profile, gpt_graph

from autoplan.cost import CostModel
from autoplan.cost.compute.roofline import host_overhead_s, op_time_s
from autoplan.cost.pp.messages import pipeline_sends_s
from autoplan.trace import trace_model_file
from autoplan.types import Plan
from autoplan.types.profile import OpOverhead, OpTiming

ROOT = Path(__file__).resolve().parents[3]


def _plan(**kw):
    fields = dict(dp=1, tp=1, pp=1, micro_batch_size=1, num_microbatches=1, precision="bf16")
    fields.update(kw)
    return Plan(devices=fields["dp"] * fields["tp"] * fields["pp"], **fields)


def _with_overhead(backend, forward_s=20e-6, backward_s=30e-6):
    profile = a100_profile()
    profile.backend = backend
    profile.device.op_overhead = OpOverhead(forward_s=forward_s, backward_s=backward_s, source="test")
    return profile


def test_cpu_backend_adds_overhead_and_gpu_backend_hides_it_under_long_ops():
    graph = gpt_graph(hidden=256, heads=8, seq_len=128, batch_size=8, layers=1)
    fc, add = graph.node("h.0.mlp.c_fc"), graph.node("h.0.add_1")
    bare = a100_profile()
    for node in (fc, add):
        base = op_time_s(node, bare, precision="bf16", batch_fraction=1.0)
        assert op_time_s(node, _with_overhead("gloo"), precision="bf16", batch_fraction=1.0) == pytest.approx(
            base + 20e-6
        )
        assert op_time_s(node, _with_overhead("nccl"), precision="bf16", batch_fraction=1.0) == pytest.approx(
            max(base, 20e-6)
        )
    # a huge overhead shows on the GPU backend too, as the host becomes the bottleneck
    assert op_time_s(fc, _with_overhead("nccl", forward_s=1.0), precision="bf16", batch_fraction=1.0) == 1.0


def test_no_overhead_for_graph_inputs_shape_arithmetic_or_backward_of_nodes_without_gradient():
    graph = gpt_graph(hidden=256, heads=8, seq_len=128, batch_size=8, layers=1)
    profile = _with_overhead("gloo")
    assert host_overhead_s(graph.node("idx"), profile, backward=False) == 0.0
    add = graph.node("h.0.add_1")
    assert host_overhead_s(add, profile, backward=True) == 30e-6
    assert host_overhead_s(add, profile, backward=True, needs_grad=False) == 0.0
    add.output_dtype = ""  # a python-level size/getattr node
    assert host_overhead_s(add, profile, backward=False) == 0.0


def test_grad_nodes_are_floating_nodes_downstream_of_parameters():
    graph = gpt_graph(hidden=64, heads=4, seq_len=16, batch_size=2, layers=2)
    grad = graph.grad_nodes()
    assert "idx" not in grad and {"wte", "h.0.ln_1", "h.1.add_2", "loss"} <= grad


def test_step_time_grows_by_the_overhead_of_every_dispatched_op():
    graph = gpt_graph(hidden=256, heads=8, seq_len=128, batch_size=8, layers=2)
    plan = _plan(micro_batch_size=8)
    base = CostModel(graph, a100_profile()).estimate(plan)
    gloo = a100_profile()
    gloo.backend = "gloo"
    bare_gloo = CostModel(graph, gloo).estimate(plan)
    with_cost = CostModel(graph, _with_overhead("gloo")).estimate(plan)
    dispatched = [n for n in graph.nodes if n.op not in ("input", "output") and n.output_dtype]
    backward = [n for n in dispatched if n.name in graph.grad_nodes()]
    expected = len(dispatched) * 20e-6 + len(backward) * 30e-6
    assert with_cost.compute_s - bare_gloo.compute_s == pytest.approx(expected, rel=1e-6)
    assert base.compute_s > 0


@pytest.mark.parametrize("m", [1, 2, 8])
def test_gradient_accumulation_reads_two_and_writes_one_gradient_per_extra_micro_batch(m):
    graph = gpt_graph(hidden=256, heads=8, seq_len=128, batch_size=8, layers=2)
    profile = a100_profile()
    cost = CostModel(graph, profile).estimate(_plan(micro_batch_size=8 // m, num_microbatches=m))
    device = profile.device
    # fp32 gradients (the executor keeps fp32 parameters outside FSDP2, cost/memory/per_device.py)
    per_micro_batch_s = 3 * graph.param_count * 4 / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)
    assert cost.grad_accum_s == pytest.approx((m - 1) * per_micro_batch_s, rel=1e-6)
    assert "grad_accum_s" in cost.TIME_FIELDS


@pytest.mark.parametrize(
    ("runtime", "reduce", "bytes_per_param"),
    [
        ("autoplan", "bf16", 12),  # autoplan's executor accumulates fp32 gradients whatever it reduces in
        ("deepspeed", "bf16", 12),
        ("megatron", "bf16", 0),  # --gradient-accumulation-fusion: the wgrad GEMM accumulates into main_grad
        ("megatron-lm-2022", "fp32", 0),  # fused into an fp32 main_grad
        ("megatron-lm-2022", "bf16", 6),  # before 2022-09 no fusion without fp32 accumulation: a bf16 pass
    ],
)
def test_gradient_accumulation_is_priced_in_the_runtime_buffer_or_not_at_all_when_fused(
    runtime, reduce, bytes_per_param
):
    graph = gpt_graph(hidden=256, heads=8, seq_len=128, batch_size=8, layers=2)
    profile = a100_profile()
    plan = _plan(micro_batch_size=2, num_microbatches=4, runtime=runtime, grad_reduce_dtype=reduce)
    cost = CostModel(graph, profile).estimate(plan)
    device = profile.device
    per_micro_batch_s = (
        bytes_per_param * graph.param_count / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency)
    )
    assert cost.grad_accum_s == pytest.approx(3 * per_micro_batch_s, rel=1e-6)


def test_fwd_bwd_op_table_row_is_split_by_flops():
    graph = gpt_graph(hidden=256, heads=8, seq_len=128, batch_size=8, layers=1)
    profile = a100_profile()
    profile.device.op_table.append(
        OpTiming(op="linear", shape="m=1024,n=1024,k=256,fwd+bwd", dtype="bf16", time_s=3e-3)
    )
    fc = graph.node("h.0.mlp.c_fc")
    assert op_time_s(fc, profile, precision="bf16", batch_fraction=1.0) == pytest.approx(1e-3)
    assert op_time_s(fc, profile, precision="bf16", batch_fraction=1.0, backward=True) == pytest.approx(2e-3)


@pytest.fixture(scope="module")
def tied_gpt():
    with pytest.MonkeyPatch.context() as mp:
        for name, value in dict(N_LAYER=2, N_EMBD=64, N_HEAD=4, BLOCK_SIZE=32, VOCAB_SIZE=512).items():
            mp.setenv(f"AUTOPLAN_GPT_{name}", str(value))
        return trace_model_file(ROOT / "examples" / "gpt.py", 4)


def test_weight_tied_across_pipeline_stages_pays_one_gradient_all_reduce(tied_gpt):
    profile = a100_profile()
    model = CostModel(tied_gpt, profile)
    split = model.estimate(_plan(pp=2, num_microbatches=4, micro_batch_size=1))
    plan = _plan(pp=2, num_microbatches=4, micro_batch_size=1)
    group = _pp_group(profile)
    sends_only = pipeline_sends_s(profile, plan, model.chunk_inputs(plan), group=group, tp_group=group)
    tied_bytes = 512 * 64 * 4  # fp32 gradients: the executor keeps parameters in fp32 outside FSDP2
    from autoplan.cost.network.comm import collective_time_s

    expected = collective_time_s(profile, "all_reduce", tied_bytes, group=_pp_group(profile))
    assert split.pp_comm_s - sends_only == pytest.approx(expected, rel=1e-6)
    assert model.tied.sync_s(_plan(num_microbatches=4, micro_batch_size=1), [], [], _pp_group(profile)) == 0.0


def _pp_group(profile):
    from autoplan.cost.network.mesh import mesh_groups

    return mesh_groups(profile, dp=1, tp=1, pp=2)["pp"]


def _ctx(model):
    from autoplan.cost.network.mesh import mesh_groups
    from autoplan.cost.tp.splits import TPContext

    groups = mesh_groups(model.profile, dp=1, tp=1, pp=2)
    return TPContext(
        profile=model.profile,
        tp=1,
        group=groups["tp"],
        sequence_parallel=False,
        precision="bf16",
        batch_fraction=1 / model.graph.batch_size,
    )
