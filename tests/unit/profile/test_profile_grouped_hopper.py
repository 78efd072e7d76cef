"""The Hopper profiles' BF16 grouped-GEMM curve (profiles/sources/grouped_gemm.py): every H100/H200
profile has it, it prices the published torch._grouped_mm call at its measured rate, FP8 grouped GEMMs
keep the FP8 matmul curve, and fit_published.py reproduces it."""

import importlib.util
import sys
from pathlib import Path

import pytest

from autoplan.profile import load_profile

HOPPER = ("dgx-h100", "dgx-h200", "aws-p5", "aws-p5en", "azure-nd-h100-v5", "gcp-a3-high")
SOURCES = Path(__file__).resolve().parents[3] / "profiles" / "sources"
PR_GROUP_FLOPS = 2.0 * 128000 * 7168 * 7168  # one group of the PR's 16 (grouped_gemm.py)
PR_RATE = 16 * PR_GROUP_FLOPS / 298.6668e-3


@pytest.mark.parametrize("name", HOPPER)
def test_hopper_profiles_price_grouped_gemms_at_the_published_rate(name):
    device = load_profile(name).device
    grouped = device.efficiency_for("grouped_matmul", "bf16")
    assert grouped is not device.efficiency_for("matmul", "bf16") and "pull/156203" in grouped.source
    rate = device.peak_flops["bf16"] * grouped(PR_GROUP_FLOPS)
    assert rate == pytest.approx(PR_RATE, rel=1e-3)  # F >> F_half: the curve's top is the measured rate
    assert device.efficiency_for("grouped_matmul", "fp8") == device.efficiency_for("matmul", "fp8")


def test_fit_published_reproduces_the_shipped_curve():
    sys.path.insert(0, str(SOURCES))
    try:
        spec = importlib.util.spec_from_file_location("fit_published_generator", SOURCES / "fit_published.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SOURCES))
    for key in ("h100", "h200"):
        built = module.build(key, module.SYSTEMS[key]).device
        shipped = load_profile(module.SYSTEMS[key]["profile"]).device
        built_curve, shipped_curve = built.efficiency["grouped_matmul"], shipped.efficiency["grouped_matmul"]
        assert built_curve.source == shipped_curve.source
        assert built_curve.max_efficiency == pytest.approx(shipped_curve.max_efficiency, rel=1e-9)
        assert built_curve.half_saturation_flops == pytest.approx(shipped_curve.half_saturation_flops, rel=1e-6)
