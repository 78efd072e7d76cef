"""FP8 pricing (precision "fp8", autoplan/cost/compute/roofline.py): torchao's tensorwise float8 recipe.

Eligible nn.Linear GEMMs run at the FP8 peak on the FP8 efficiency curve plus their casts, priced
as memory-bound passes (5 bytes per element per cast, 2 per layout copy); everything else and all
memory are bf16's; a profile without an FP8 peak refuses fp8 with one sentence.
"""

from pathlib import Path

import pytest

from autoplan.cost import CostModel
from autoplan.cost.compute.fp8 import fp8_cast_bytes, fp8_linear
from autoplan.cost.compute.roofline import memory_time_s, op_time_s
from autoplan.cost.network.comm import collective_time_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.cost.volumes import predict
from autoplan.errors import PlanError, ProfileError
from autoplan.profile import load_profile
from autoplan.trace import trace_model_file
from autoplan.types import Plan, Profile
from autoplan.types.graph import OpNode

ROOT = Path(__file__).resolve().parents[3]
H100_FAMILY = ("dgx-h100", "dgx-h200", "aws-p5", "aws-p5en", "gcp-a3-high", "azure-nd-h100-v5")
NO_FP8 = ("dgx-a100", "aws-p4d", "aws-p4de", "aws-p3", "cpu-gloo")


@pytest.fixture(scope="module")
def h100():
    return load_profile("dgx-h100")


@pytest.fixture(scope="module")
def gpt_graph():
    """examples/gpt.py at width 2048, 4096 tokens per sequence: large linears, traced on meta."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in dict(N_LAYER=2, N_EMBD=2048, N_HEAD=16, BLOCK_SIZE=4096, VOCAB_SIZE=32000).items():
            mp.setenv(f"AUTOPLAN_GPT_{name}", str(value))
        return trace_model_file(ROOT / "examples" / "gpt.py", 4)


def _linear(fin: int, fout: int, *, tokens: int = 8192, splittable: bool = True) -> OpNode:
    """A bf16 nn.Linear over ``tokens`` rows, as the tracer records one."""
    return OpNode(
        name="fc",
        op="linear",
        target="Linear",
        module="fc",
        layer=None,
        param_count=fin * fout,
        param_bytes=fin * fout * 2,
        output_shape=[1, tokens, fout],
        output_dtype="torch.bfloat16",
        output_bytes=2 * tokens * fout,
        saved_bytes=2 * tokens * fin,
        fwd_flops=2 * tokens * fin * fout,
        bwd_flops=4 * tokens * fin * fout,
        attrs={"in_features": fin, "out_features": fout, "bias": False, "tp_splittable": splittable},
    )


def _times(node, profile, precision, **kw):
    kw = dict(precision=precision, batch_fraction=1.0, **kw)
    return op_time_s(node, profile, **kw), op_time_s(node, profile, backward=True, **kw)


def _plan(precision, **kw):
    fields = dict(devices=1, dp=1, tp=1, pp=1, micro_batch_size=1, num_microbatches=4, precision=precision)
    fields.update(kw)
    fields["devices"] = fields["dp"] * fields["tp"] * fields["pp"]
    return Plan(**fields)


# ---- profiles ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", H100_FAMILY)
def test_hopper_profiles_carry_a_sourced_fp8_peak_and_curve(name):
    device = load_profile(name).device
    assert device.peak_flops["fp8"] == pytest.approx(1978.9e12)
    curve = device.efficiency_by_dtype["fp8"]["matmul"]
    assert "FP8 GEMM sweep" in curve.source and "FP8 peak" in curve.source
    # the bf16 curve is the same fit with F_half rescaled by bf16/fp8 peak (profiles/sources/fit_published.py)
    bf16 = device.efficiency["matmul"]
    assert curve.max_efficiency == bf16.max_efficiency
    ratio = device.peak_flops["fp8"] / device.peak_flops["bf16"]
    assert curve.half_saturation_flops == pytest.approx(ratio * bf16.half_saturation_flops)


@pytest.mark.parametrize("name", NO_FP8)
def test_other_profiles_have_no_fp8(name):
    device = load_profile(name).device
    assert "fp8" not in device.peak_flops and "fp8" not in device.efficiency_by_dtype


def test_profile_with_fp8_peak_loads_and_an_unknown_dtype_is_refused(h100):
    data = h100.to_dict()
    assert Profile.from_dict(data).device.peak_flops["fp8"] == h100.device.peak_flops["fp8"]
    data["device"]["peak_flops"]["fp4"] = 1e15
    with pytest.raises(ProfileError, match=r"dtype 'fp4'; expected one of fp32, tf32, bf16, fp16, fp8\.$"):
        Profile.from_dict(data)


# ---- one linear ----------------------------------------------------------------------------
def test_eligibility_is_nn_linear_with_dims_multiple_of_16_per_shard():
    assert fp8_linear(_linear(4096, 4096), precision="fp8")
    assert not fp8_linear(_linear(4096, 4096), precision="bf16")
    assert not fp8_linear(_linear(40, 4096), precision="fp8")
    assert not fp8_linear(_linear(4096, 4096, splittable=False), precision="fp8")  # not an nn.Linear
    assert fp8_linear(_linear(80, 4096), precision="fp8", shard=1)
    assert not fp8_linear(_linear(80, 4096), precision="fp8", shard=2)  # 40 columns on a rank


def test_linear_with_in_features_40_stays_at_bf16_time(h100):
    node = _linear(40, 4096)
    assert _times(node, h100, "fp8") == _times(node, h100, "bf16")


def test_fp8_linear_is_the_fp8_roofline_plus_the_counted_casts(h100):
    m, k, n = 8192, 4096, 14336
    node = _linear(k, n, tokens=m)
    x, w, g = m * k, k * n, m * n
    assert fp8_cast_bytes(node, batch_fraction=1.0, backward=False) == 5 * (x + w)
    assert fp8_cast_bytes(node, batch_fraction=1.0, backward=True) == 12 * g + 7 * w + 7 * x
    device = h100.device
    gemm_s = (2 * m * k * n + device.efficiency_by_dtype["fp8"]["matmul"].half_saturation_flops) / (
        device.peak_flops["fp8"] * device.efficiency_by_dtype["fp8"]["matmul"].max_efficiency
    )
    fwd, _ = _times(node, h100, "fp8")
    assert fwd == pytest.approx(gemm_s + memory_time_s(h100, 5 * (x + w)))


def test_large_linear_is_faster_in_fp8_but_by_less_than_the_peak_ratio(h100):
    node = _linear(8192, 28672, tokens=16384)
    bf16, fp8 = (sum(_times(node, h100, p)) for p in ("bf16", "fp8"))
    ratio = h100.device.peak_flops["fp8"] / h100.device.peak_flops["bf16"]
    assert 1.2 < bf16 / fp8 < ratio


def test_small_linear_is_slower_in_fp8_the_casts_dominate(h100):
    node = _linear(4096, 4096, tokens=256)
    assert sum(_times(node, h100, "fp8")) > sum(_times(node, h100, "bf16"))


def test_cast_overhead_grows_with_tokens(h100):
    node = _linear(4096, 4096, tokens=4096)

    def overhead_s(fraction):
        fp8 = op_time_s(node, h100, precision="fp8", batch_fraction=fraction, backward=True)
        return fp8, memory_time_s(h100, fp8_cast_bytes(node, batch_fraction=fraction, backward=True))

    (t1, c1), (t2, c2), (t4, c4) = overhead_s(1.0), overhead_s(2.0), overhead_s(4.0)
    assert c1 < c2 < c4 and t1 < t2 < t4
    # the weight's passes are paid once per micro-batch: more tokens, less overhead per token
    assert c4 / 4 < c2 / 2 < c1


def test_tensor_parallel_shard_divides_the_casts(h100):
    node = _linear(4096, 4096)
    one = op_time_s(node, h100, precision="fp8", batch_fraction=1.0, shard=1)
    two = op_time_s(node, h100, precision="fp8", batch_fraction=1.0, shard=2)
    assert two < one and fp8_linear(node, precision="fp8", shard=8)


def test_attention_and_batched_matmuls_price_as_bf16(gpt_graph, h100):
    others = [n for n in gpt_graph.nodes if n.op in ("attention", "matmul", "norm", "elementwise", "embedding")]
    assert any(n.op == "attention" for n in others)
    for node in others:
        assert _times(node, h100, "fp8") == _times(node, h100, "bf16"), node.name


# ---- whole plans ---------------------------------------------------------------------------
def test_gpt_step_is_faster_in_fp8_by_less_than_2x(gpt_graph, h100):
    plan = dict(micro_batch_size=2, num_microbatches=2)
    bf16, fp8 = (CostModel(gpt_graph, h100).estimate(_plan(p, **plan)) for p in ("bf16", "fp8"))
    assert 1.0 < bf16.step_time_s / fp8.step_time_s < 2.0


def test_fp8_memory_equals_bf16(gpt_graph, h100):
    for plan in (dict(), dict(dp=2, zero_stage=3), dict(tp=2, sequence_parallel=True), dict(pp=2)):
        bf16, fp8 = (CostModel(gpt_graph, h100).estimate(_plan(p, **plan)) for p in ("bf16", "fp8"))
        assert fp8.peak_memory_bytes == bf16.peak_memory_bytes
        assert fp8.activations_bytes == bf16.activations_bytes


def test_fp8_moves_what_bf16_moves_and_no_fp16_overflow_flag(gpt_graph, h100):
    plan = dict(dp=2, tp=1, pp=2, num_microbatches=4)  # at tp = 1 no scale is reduced (cost/tp/amax.py)
    comm = {p: [s.comm for s in predict(CostModel(gpt_graph, h100), _plan(p, **plan))] for p in ("bf16", "fp8", "fp16")}
    assert comm["fp8"] == comm["bf16"]
    assert comm["fp16"] != comm["bf16"]  # fp16 adds its overflow all-reduce (cost/volumes.py)


@pytest.mark.parametrize("sp", (False, True))
def test_tensorwise_fp8_under_tp_adds_three_scalar_amax_all_reduces_per_split_linear(gpt_graph, h100, sp):
    """torchao's tensorwise scales under tp=2 (cost/tp/amax.py): per split FP8 linear and micro-batch, one
    8-byte all-reduce for each cast of a sharded tensor (weight twice, and a rowwise input or a colwise
    output gradient), on top of every message bf16 sends; the audit counted 174 = 29 x 3 x 2 of them."""
    plan = dict(dp=2, tp=2, num_microbatches=4, sequence_parallel=sp)
    (was,), (now,) = (predict(CostModel(gpt_graph, h100), _plan(p, **plan)) for p in ("bf16", "fp8"))
    split = [n for n in gpt_graph.nodes if fp8_linear(n, precision="fp8", shard=2)]  # every linear is split
    reduces = ("tp", "all_reduce")
    count, size = (now.comm[reduces][i] - was.comm.get(reduces, [0, 0.0])[i] for i in (0, 1))
    assert len(split) == 9 and count == 3 * len(split) * 4 and size == 8 * count
    assert {k: v for k, v in now.comm.items() if k != reduces} == {k: v for k, v in was.comm.items() if k != reduces}


@pytest.mark.parametrize("name", ("dgx-a100", "cpu-gloo"))
def test_fp8_without_an_fp8_peak_raises_one_sentence(gpt_graph, name):
    profile = load_profile(name)
    with pytest.raises(PlanError) as info:
        CostModel(gpt_graph, profile).estimate(_plan("fp8"))
    message = str(info.value)
    assert message == (
        f"profile '{profile.name}' device '{profile.device.name}' has no FP8 peak (device.peak_flops.fp8): "
        "FP8 needs a GPU with FP8 tensor cores (H100, H200, ...); use precision bf16."
    )
    assert message.count(". ") == 0


def test_torchtitan_casting_before_the_all_gather_reduces_sequence_sharded_amaxes_too(gpt_graph, h100):
    """torchtitan's float8 TP styles cast before the redistribution (cost/tp/amax.py): under SP, per micro-batch
    one more all-reduce per block input its colwise linears share (ln_1, ln_2 per block, ln_f: 5) and per rowwise
    output reduce-scattered to the sequence (both c_proj per block: 4); without SP the same as autoplan's."""
    extra = {}  # the tp all-reduces fp8 adds over bf16, (count, bytes)
    for runtime in ("autoplan", "torchtitan"):
        for sp in (False, True):
            plans = (_plan(p, tp=2, num_microbatches=4, sequence_parallel=sp, runtime=runtime) for p in ("bf16", "fp8"))
            (was,), (now,) = (predict(CostModel(gpt_graph, h100), plan) for plan in plans)
            extra[runtime, sp] = [b - a for a, b in zip(was.comm[("tp", "all_reduce")], now.comm[("tp", "all_reduce")])]
    assert extra["torchtitan", False] == extra["autoplan", False] == [3 * 9 * 4, 8 * 3 * 9 * 4]
    assert extra["torchtitan", True] == [(3 * 9 + 5 + 4) * 4, 8 * (3 * 9 + 5 + 4) * 4]


def test_async_tp_slices_cast_each_fp8_weight_once(gpt_graph, h100):
    """Casts and GEMMs are faster in fp8 under async TP; what the step loses is the scales' scalar all-reduces
    (cost/tp/amax.py: 3 per split linear per micro-batch, 9 linears, 2 micro-batches), each at its alpha."""
    plan = dict(tp=4, sequence_parallel=True, tp_comm_overlap=True, micro_batch_size=2, num_microbatches=2)
    bf16, fp8 = (CostModel(gpt_graph, h100).estimate(_plan(p, **plan)) for p in ("bf16", "fp8"))
    scales_s = 3 * 9 * 2 * collective_time_s(h100, "all_reduce", 8, group=AxisGroup(4, 8))
    assert bf16.step_time_s < fp8.step_time_s < bf16.step_time_s + scales_s
