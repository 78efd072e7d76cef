"""The profiler's grouped-GEMM and FP8 cases, and curves fitted from synthetic timings: a grouped row
stands for 3E expert GEMMs, and the fitted curve makes the cost model's grouped-GEMM price
(cost/moe/experts.py) give back the measured time; causal and full attention share one curve."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoplan.cost.moe.experts import ExpertPlacement, grouped_gemm_s
from autoplan.cost.network.mesh import AxisGroup
from autoplan.profile import load_profile
from autoplan.profile.fit import predict_op_s
from autoplan.profile.measure import compute_job
from autoplan.profile.measure.build import device_spec
from autoplan.profile.measure.compute import (
    QUICK_SWEEP,
    ComputeSweep,
    dtype_specs,
    grouped_case,
    kernel_calls,
    make_case,
    matmul_case,
    spec,
)
from autoplan.types.graph import OpNode
from autoplan.types.moe import MoELayer
from autoplan.types.profile import OpTiming, Profile

CPU = torch.device("cpu")


def _reference_grads(x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """y_e = x_e W_e per expert under autograd: (y, dX, dW)."""
    x, weight = x.clone().requires_grad_(), weight.clone().requires_grad_()
    y = torch.stack([x[e] @ weight[e] for e in range(x.shape[0])])
    return (y, *torch.autograd.grad(y, (x, weight), grad))


@pytest.mark.parametrize("native", [1, 0])
def test_grouped_case_runs_the_expert_gemms_of_a_training_step(native: int) -> None:
    experts, m, k, n = 3, 4, 8, 12  # torch._grouped_mm wants 16-byte strides
    case = grouped_case(experts=experts, m=m, k=k, n=n, native=native)
    torch.manual_seed(0)
    y, grad_x, grad_w = case.build(torch.float32, CPU)()
    torch.manual_seed(0)
    x, weight, grad = (torch.randn(*size) for size in ((experts, m, k), (experts, k, n), (experts, m, n)))
    ref_y, ref_dx, ref_dw = _reference_grads(x, weight, grad)
    assert torch.allclose(y.reshape(experts, m, n), ref_y, atol=1e-5)
    assert torch.allclose(grad_x.reshape(experts, m, k), ref_dx, atol=1e-5)
    assert torch.allclose(grad_w, ref_dw, atol=1e-5)
    assert case.flops == 3 * experts * 2 * m * k * n
    assert case.shape == f"E=3,m=4,k=8,n=12,{'grouped_mm' if native else 'bmm'},fwd+bwd"
    assert kernel_calls(case.op_class, case.shape) == 3 * experts


def test_fp8_matmul_case_runs_the_three_gemms_as_scaled_mm() -> None:
    m, n, k = 16, 32, 48
    step = matmul_case(m=m, n=n, k=k).build(torch.float8_e4m3fn, CPU)
    outs = step()
    assert [tuple(o.shape) for o in outs] == [(m, n), (m, k), (n, k)] and all(o.dtype == torch.bfloat16 for o in outs)
    specs = dtype_specs(QUICK_SWEEP, dtype_name="fp8", device=CPU)
    assert specs and {s.kind for s in specs} == {"matmul"}  # fp8 times scaled GEMMs only


def test_the_job_marks_grouped_cases_with_the_kernel_this_torch_runs() -> None:
    job = compute_job(sweep=QUICK_SWEEP, dtypes=["fp32"], model=None, batch=None, device=CPU)
    grouped = [make_case(s) for s, _ in job.items if s.kind == "grouped_matmul"]
    expected = "grouped_mm" if hasattr(torch, "_grouped_mm") else "bmm"
    assert len(grouped) == len(QUICK_SWEEP.grouped) and all(f",{expected}," in c.shape for c in grouped)
    masks = {make_case(s).shape.split(",")[4] for s, _ in job.items if s.kind == "attention"}
    assert masks == {"causal", "full"}


# synthetic device: a per-class (max_efficiency, half_saturation_flops) truth on a 1e12 FLOP/s peak
PEAK, TRUTH = 1e12, {"matmul": (0.8, 4e6), "attention": (0.4, 2e7), "grouped_matmul": (0.6, 1e7)}
SWEEP = ComputeSweep(
    matmul=((64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (2048, 512, 1024)),
    attention=((1, 4, 128, 64, 1), (1, 4, 512, 64, 0), (2, 8, 1024, 64, 1), (1, 8, 2048, 64, 0)),
    conv=(),
    grouped=((4, 32, 128, 128), (8, 128, 512, 256), (16, 256, 1024, 512), (64, 64, 2048, 768)),
)


def _measured_s(op: str, shape: str, flops: float) -> float:
    """What the cost model prices for one timed call: each of its kernel calls on the true curve."""
    a, half = TRUTH[op]
    calls = kernel_calls(op, shape)
    if op == "grouped_matmul":  # each expert's forward GEMM once, its backward as two
        return calls * predict_op_s(flops=flops / calls, peak_flops=PEAK, max_efficiency=a, half_saturation_flops=half)
    return sum(  # forward F/3, backward 2F/3
        predict_op_s(flops=f, peak_flops=PEAK, max_efficiency=a, half_saturation_flops=half)
        for f in (flops / 3, 2 * flops / 3)
    )


def _fitted() -> tuple[list[OpTiming], Profile]:
    """Rows timed as the cost model prices them, fitted by the profiler into the cpu-gloo profile's device."""
    cases = [make_case(s) for s in dtype_specs(SWEEP, dtype_name="fp32", device=CPU)]
    rows = [OpTiming(c.op_class, c.shape, "fp32", _measured_s(c.op_class, c.shape, c.flops), c.flops) for c in cases]
    device = device_spec(
        name="synthetic", memory_bytes=2**34, rows=rows, copy_bandwidth=1e15, memory_efficiency=1.0, threads=1
    )
    return rows, dataclasses.replace(load_profile("cpu-gloo"), device=device)


def test_fitted_curves_recover_each_class_from_synthetic_timings() -> None:
    _, profile = _fitted()
    device = profile.device
    # the peak is the best saturated rate over classes, each fitted per kernel call (3E for a grouped row)
    assert device.peak_flops["fp32"] == pytest.approx(max(a for a, _ in TRUTH.values()) * PEAK, rel=1e-3)
    for op, (a, half) in TRUTH.items():
        curve = device.efficiency_for(op, "fp32")
        assert curve.max_efficiency * device.peak_flops["fp32"] == pytest.approx(a * PEAK, rel=1e-3), op
        assert curve.half_saturation_flops == pytest.approx(half, rel=1e-2), op


def test_the_cost_model_prices_a_fitted_grouped_row_at_its_measured_time() -> None:
    rows, profile = _fitted()
    place = ExpertPlacement(ep=1, imbalance=1.0, group=AxisGroup(size=1, ranks_per_node=1))
    for row in (r for r in rows if r.op == "grouped_matmul"):
        sizes = dict(part.split("=") for part in row.shape.split(",") if "=" in part)
        e, m, k, n = (int(sizes[key]) for key in ("E", "m", "k", "n"))
        node = OpNode(
            name="w1",
            op="matmul",
            target="bmm",
            module="moe.experts",
            layer=None,
            output_shape=[e, m, n],
            fwd_flops=2 * e * m * k * n,
        )
        moe = MoELayer(
            module="moe",
            experts_module="moe.experts",
            layer=None,
            num_experts=e,
            top_k=1,
            hidden_size=k,
            expert_ffn_size=n,
            expert_param_names=[],
            params_per_expert=k * n,
            slots_per_expert=m,
        )
        fwd, bwd = grouped_gemm_s(node, moe, profile, precision="fp32", batch_fraction=1.0, place=place)
        assert fwd + bwd == pytest.approx(row.time_s, rel=1e-3), row.shape


def test_quick_sweep_keeps_a_spec_per_case_kind() -> None:
    kinds = {s.kind for s in QUICK_SWEEP.specs()}
    assert kinds == {"matmul", "attention", "grouped_matmul", "conv"}
    assert make_case(spec("grouped_matmul", experts=2, m=3, k=4, n=5)).flops == 3 * 2 * 2 * 3 * 4 * 5
