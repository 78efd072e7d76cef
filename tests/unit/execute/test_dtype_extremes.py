"""A pipeline stage's exported graph fills masked scores with the extreme of the dtype it fills
(autoplan/execute/dtype_extremes.py): torch.export recorded fp32's, which bf16 and fp16 cannot hold."""

from __future__ import annotations

import pytest
import torch

from autoplan.execute.dtype_extremes import as_dtype_extreme, read_extremes_by_dtype

FP32_MIN = torch.finfo(torch.float32).min


def test_fp32_extremes_become_the_filled_dtypes_and_other_values_stay():
    assert as_dtype_extreme(FP32_MIN, torch.bfloat16) == torch.finfo(torch.bfloat16).min
    assert as_dtype_extreme(-FP32_MIN, torch.float16) == torch.finfo(torch.float16).max
    assert as_dtype_extreme(FP32_MIN, torch.float32) == FP32_MIN
    assert as_dtype_extreme(-1e4, torch.bfloat16) == -1e4 and as_dtype_extreme(float("-inf"), torch.float16) < 0
    assert as_dtype_extreme(FP32_MIN, torch.int64) == FP32_MIN  # not a float: left to torch


def test_an_exported_masked_fill_of_fp32_min_runs_on_bf16_scores():
    class Scores(torch.nn.Module):
        def forward(self, s, mask):
            return s.masked_fill(mask, torch.finfo(s.dtype).min)

    s, mask = torch.randn(2, 4), torch.tensor([[True, False, False, True]] * 2)
    module = torch.export.export(Scores(), (s, mask)).module()
    bf16 = s.bfloat16()
    with pytest.raises(RuntimeError, match="without overflow"):  # what the stage did before the rewrite
        module(bf16, mask)
    assert read_extremes_by_dtype(module) == 1
    out = module(bf16, mask)
    assert torch.equal(out, Scores()(bf16, mask)) and out.dtype == torch.bfloat16
    assert torch.equal(module(s, mask), Scores()(s, mask))  # fp32 fills fp32's, as before
