"""A fused attention kernel's executed FLOPs (causal tiles, sliding windows, explicit masks) and
the per-generation forward/backward curves the shipped GPU profiles carry."""

from __future__ import annotations

import pytest

from autoplan.cost.compute.roofline import moved_bytes, op_time_s
from autoplan.errors import ProfileError
from autoplan.profile import load_profile
from autoplan.types.attention import FLASH_TILE, executed_fraction
from autoplan.types.graph import OpNode
from autoplan.types.profile import Efficiency


def _attention(*, seq=8192, heads=32, kv_heads=32, head_dim=128, batch=1, **attrs) -> OpNode:
    fwd = 4 * batch * heads * seq * seq * head_dim
    attrs = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim, "q_len": seq, "kv_len": seq, **attrs}
    attrs["bwd_recompute_flops"] = fwd // 2
    return OpNode(
        name="attn",
        op="attention",
        target="scaled_dot_product_attention",
        module="layers.0.attn",
        layer="layers.0",
        output_shape=[batch, heads, seq, head_dim],
        output_dtype="torch.bfloat16",
        output_bytes=2 * batch * heads * seq * head_dim,
        fwd_flops=fwd,
        bwd_flops=2 * fwd,
        attrs=attrs,
    )


@pytest.mark.parametrize("seq", [128, 1024, 4096, 32768])
def test_causal_runs_the_diagonal_tiles_and_below(seq):
    # FA2 section 3.1.1: n(n+1)/2 of n^2 tiles, n = s / T
    assert executed_fraction({"q_len": seq, "kv_len": seq, "causal": True}) == pytest.approx(
        0.5 * (1 + FLASH_TILE / seq)
    )


def test_unmasked_or_explicitly_masked_attention_runs_every_tile():
    assert executed_fraction({"q_len": 4096, "kv_len": 4096, "causal": False}) == 1.0
    # an explicit attn_mask is read for every tile: no skipping, whatever the mask holds
    assert executed_fraction({"q_len": 4096, "kv_len": 4096, "causal": True, "has_mask": True}) == 1.0


def test_sliding_window_runs_about_window_plus_a_tile_per_query():
    seq, window = 8192, 128
    fraction = executed_fraction({"q_len": seq, "kv_len": seq, "causal": True, "window": window})
    # each 128-query block after the first visits its own tile and the one before: 2 T keys of s
    assert fraction == pytest.approx((2 * FLASH_TILE * (seq - FLASH_TILE) + FLASH_TILE * FLASH_TILE) / seq**2)
    assert fraction < 0.04


def test_causal_with_fewer_queries_than_keys_aligns_to_the_last_key():
    # one query block of 128 seeing all 1024 keys (bottom-right aligned): every tile runs
    assert executed_fraction({"q_len": 128, "kv_len": 1024, "causal": True}) == 1.0


def test_gqa_reads_keys_and_values_once_per_kv_head():
    mha, gqa = _attention(kv_heads=32), _attention(kv_heads=4)
    out = mha.output_bytes
    assert moved_bytes(mha, precision="bf16", gpu=True, backward=False) == pytest.approx(4 * out)
    assert moved_bytes(gqa, precision="bf16", gpu=True, backward=False) == pytest.approx((2 + 2 * 4 / 32) * out)


def test_gpu_prices_causal_attention_at_its_executed_flops():
    h100 = load_profile("dgx-h100")
    kwargs = dict(precision="bf16", batch_fraction=1.0)
    for backward in (False, True):
        full = op_time_s(_attention(causal=False), h100, backward=backward, **kwargs)
        causal = op_time_s(_attention(causal=True), h100, backward=backward, **kwargs)
        assert causal / full == pytest.approx(0.5 * (1 + FLASH_TILE / 8192), rel=0.05)
    masked = op_time_s(_attention(causal=True, has_mask=True), h100, **kwargs)
    assert masked == pytest.approx(op_time_s(_attention(causal=False), h100, **kwargs))


def test_cpu_profile_keeps_whole_rectangle_flops():
    # the CPU curve was measured on causal calls counted whole (docs/profile-format.md)
    cpu = load_profile("cpu-gloo")
    kwargs = dict(precision="fp32", batch_fraction=1.0)
    node_full, node_causal = _attention(seq=1024, causal=False), _attention(seq=1024, causal=True)
    assert op_time_s(node_causal, cpu, **kwargs) == op_time_s(node_full, cpu, **kwargs)


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-h200", "aws-p5", "aws-p5en", "azure-nd-h100-v5", "gcp-a3-high"])
def test_hopper_profiles_carry_each_runtimes_kernel_forward_and_backward(name):
    device = load_profile(name).device
    # the FA3 paper's bars, 16k tokens of 16 heads of 128: FA2 (PyTorch SDPA) and cuDNN (Transformer Engine)
    flops = 4 * 16384 * 16384 * 16 * 128
    for op_class, kernel, tflops in (("attention", "FlashAttention-2", 370), ("attention_te", "cuDNN", 595)):
        forward, backward = (
            device.efficiency_for(op_class, "bf16"),
            device.efficiency_for(f"{op_class}_backward", "bf16"),
        )
        assert kernel in forward.source and "backward" in backward.source
        # within 5%: cuDNN's bars peak at 2k (617) and ease to 595 at 16k, which a saturating curve cannot follow
        assert forward(flops) * device.peak_flops["bf16"] == pytest.approx(tflops * 1e12, rel=0.05)
        assert backward(2.5 * flops) < forward(flops)  # the backward runs at a lower rate at every size


def test_megatron_prices_attention_at_transformer_engines_kernel():
    h100 = load_profile("dgx-h100")
    kwargs = dict(precision="bf16", batch_fraction=1.0)
    sdpa, te = _attention(causal=True), _attention(causal=True, kernel="te")
    for backward in (False, True):
        assert op_time_s(te, h100, backward=backward, **kwargs) < op_time_s(sdpa, h100, backward=backward, **kwargs)
    # a profile without a TE curve falls back to the SDPA kernel's
    a100 = load_profile("dgx-a100")
    assert op_time_s(te, a100, backward=True, **kwargs) == op_time_s(sdpa, a100, backward=True, **kwargs)


def test_a100_backward_falls_back_to_its_flashattention2_curve():
    device = load_profile("dgx-a100").device
    assert device.efficiency_for("attention_backward", "bf16") is device.efficiency_for("attention", "bf16")
    assert "Flash Attention 2" in device.efficiency_for("attention", "bf16").source


def test_profile_refuses_an_unknown_op_class():
    profile = load_profile("dgx-h100")
    profile.device.efficiency["attention_bwd"] = Efficiency(max_efficiency=0.5, half_saturation_flops=1e9, source="x")
    with pytest.raises(ProfileError, match="attention_backward"):
        profile.device.check()
