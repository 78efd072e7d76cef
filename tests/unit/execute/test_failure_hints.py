"""What a rank's failure line adds to the exception's first line (execute/job/failure_hints.py)."""

from __future__ import annotations

from autoplan.execute.job.failure_hints import failure_hint

INDEX_ADD = "index_add_(): self (Float) and source (BFloat16) must have the same scalar type"


def test_a_dtype_mix_under_a_low_precision_plan_says_what_to_change():
    said = failure_hint(INDEX_ADD, precision="bf16")
    assert "under this bf16 plan an op met tensors of two dtypes" in said and "--fix precision=fp32" in said
    assert "dtype=x.dtype" in said


def test_a_dtype_mix_under_fp32_and_other_errors_add_nothing():
    assert failure_hint(INDEX_ADD, precision="fp32") == ""
    assert failure_hint("CUDA out of memory. Tried to allocate 2.00 GiB", precision="bf16") == ""


def test_a_timeout_says_the_ranks_disagree_or_one_hung():
    assert "the ranks disagree on their collectives" in failure_hint("Timed out waiting 45000ms", precision="fp32")
