"""Compute cases: FLOPs counted as the tracer counts them, fits of forward + backward points,
the matmul case as a training linear's three GEMMs, and the merge of per-rank times (median over ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoplan.profile.fit import fit_efficiency, predict_op_s
from autoplan.profile.measure import compute_job, merge_compute
from autoplan.profile.measure.compute import (
    KERNEL_CALLS,
    QUICK_SWEEP,
    attention_case,
    kernel_calls,
    make_case,
    matmul_case,
    spec,
)
from autoplan.profile.measure.optable import node_spec
from autoplan.profile.measure.ranks import RankResult
from autoplan.trace.flops import flop_counter
from autoplan.types.attention import executed_fraction
from autoplan.types.graph import OpNode


@pytest.mark.parametrize("causal", [1, 0])
def test_attention_case_flops_are_what_the_kernels_execute_forward_plus_backward(causal: int) -> None:
    b, h, s, d = 2, 3, 16, 8
    case = attention_case(batch=b, heads=h, seq=s, head_dim=d, causal=causal)
    step = case.build(torch.float32, torch.device("cpu"))
    with flop_counter() as counter:
        grads = step()
    assert len(grads) == 3 and all(g.shape == (b, h, s, d) for g in grads)
    # the tracer's model FLOPs (forward + 2x backward, the whole s x s rectangle) plus the scores the
    # backward recomputes; a causal kernel computes half of them (FlashAttention's count)
    recomputed = 2 * b * h * s * s * d
    assert counter.get_total_flops() == 3 * 4 * b * h * s * s * d
    assert case.flops == counter.get_total_flops() + recomputed  # on a CPU the whole rectangle, as priced
    gpu = attention_case(batch=b, heads=h, seq=s, head_dim=d, causal=causal, gpu=1)
    share = executed_fraction({"q_len": s, "kv_len": s, "causal": bool(causal)})
    assert share == (1.0 if not causal else 1.0)  # 16 tokens: one 128-wide tile, nothing skipped
    big = attention_case(batch=1, heads=1, seq=1024, head_dim=8, causal=causal, gpu=1)
    assert big.flops == pytest.approx((0.5 * (1 + 128 / 1024) if causal else 1.0) * 3.5 * 4 * 1024 * 1024 * 8)
    assert gpu.flops == share * (counter.get_total_flops() + recomputed) == share * 3.5 * 4 * b * h * s * s * d
    assert case.training and case.shape.endswith(("causal" if causal else "full") + ",fwd+bwd")
    assert kernel_calls("attention", case.shape) == 2


def test_matmul_case_times_a_linears_forward_and_both_backward_gemms() -> None:
    m, n, k = 5, 7, 3
    case = matmul_case(m=m, n=n, k=k)
    torch.manual_seed(0)
    y, grad_x, grad_w = case.build(torch.float32, torch.device("cpu"))()
    torch.manual_seed(0)
    x, weight, grad = (torch.randn(*size) for size in ((m, k), (n, k), (m, n)))
    x.requires_grad_(), weight.requires_grad_()
    with flop_counter() as counter:
        out = F.linear(x, weight)
        expected = torch.autograd.grad(out, (x, weight), grad)
    assert torch.allclose(y, out) and torch.allclose(grad_x, expected[0]) and torch.allclose(grad_w, expected[1])
    assert case.flops == counter.get_total_flops() == 6.0 * m * n * k
    assert case.shape == "m=5,n=7,k=3,fwd+bwd" and KERNEL_CALLS["matmul"] == 2 and not case.training


def _grads(*, causal: bool, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(*shape, requires_grad=True) for _ in range(3))
    grad = torch.randn(*shape)
    return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v), grad)


@pytest.mark.parametrize("causal", [1, 0])
def test_attention_case_times_the_masked_training_step(causal: int) -> None:
    shape = (1, 2, 6, 4)
    torch.manual_seed(0)
    step = attention_case(batch=1, heads=2, seq=6, head_dim=4, causal=causal).build(torch.float32, torch.device("cpu"))
    got = step()
    for expected_causal in (True, False):
        same = all(torch.allclose(a, b) for a, b in zip(got, _grads(causal=expected_causal, shape=shape)))
        assert same == (expected_causal == bool(causal))


def test_fit_of_two_call_points_matches_the_cost_models_forward_plus_backward_sum() -> None:
    """A point timing forward (F) + backward (2F) is fitted so that pricing each call with the
    curve and adding them gives back the measured time."""
    a, half, peak = 0.6, 4e7, 1e11
    forward = [1e6 * 4**i for i in range(8)]
    measured = [
        predict_op_s(flops=f, peak_flops=peak, max_efficiency=a, half_saturation_flops=half)
        + predict_op_s(flops=2 * f, peak_flops=peak, max_efficiency=a, half_saturation_flops=half)
        for f in forward
    ]
    fitted_a, fitted_half = fit_efficiency(
        flops=[3 * f for f in forward], time_s=measured, peak_flops=[peak] * 8, calls=2
    )
    assert fitted_a == pytest.approx(a, rel=1e-3) and fitted_half == pytest.approx(half, rel=1e-2)


def test_model_nodes_become_picklable_cases() -> None:
    linear = OpNode(
        name="l",
        op="linear",
        target="linear",
        module="l",
        layer=None,
        output_shape=[2, 16, 64],
        attrs={"in_features": 32, "out_features": 64},
    )
    attention = OpNode(
        name="a",
        op="attention",
        target="sdpa",
        module="a",
        layer=None,
        output_shape=[2, 4, 16, 8],
        attrs={"num_heads": 4, "head_dim": 8, "q_len": 16, "causal": True},
    )
    lin, att = make_case(node_spec(linear)), make_case(node_spec(attention))
    assert (lin.op_class, lin.shape, lin.flops) == ("linear", "m=32,n=64,k=32,fwd+bwd", 6.0 * 32 * 64 * 32)
    assert att.op_class == "attention" and att.shape == "b=2,h=4,s=16,d=8,causal,fwd+bwd"


def test_merge_takes_the_median_over_ranks() -> None:
    job = compute_job(sweep=QUICK_SWEEP, dtypes=["fp32"], model=None, batch=None)
    n = len(job.items)
    per_rank = {
        r: RankResult(compute_s=[scale * (i + 1) for i in range(n)], memory=(scale * 1e9, 0.5 * scale), collectives={})
        for r, scale in enumerate((1.0, 2.0, 10.0))
    }
    rows, (copy_bw, mem_eff) = merge_compute(job, per_rank)
    assert [r.time_s for r in rows] == [2.0 * (i + 1) for i in range(n)]
    assert (copy_bw, mem_eff) == (2e9, 1.0)
    assert rows[0].op == "matmul" and {r.op for r in rows} == {"matmul", "attention", "conv", "grouped_matmul"}
    assert make_case(spec("matmul", m=2, n=3, k=4)).flops == 144.0
