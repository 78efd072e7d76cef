"""What a rank's failure line adds to the exception's own first line, for the launcher to print (the launcher names
the rank and the line: jobs/launcher.py ``failure_message``)."""

from __future__ import annotations

#: the first lines of torch's dtype checks: an op given tensors of two floating dtypes
DTYPE_MIX = (
    "must have the same scalar type",
    "must have the same dtype",
    "expected scalar type",
    "to be of the same dtype",
    "expected both vectors to have same dtype",
    "dtype mismatch",
)


def failure_hint(first_line: str, *, precision: str) -> str:
    """The clause after the exception's first line that says what it most likely means, or ""."""
    if "Timed out" in first_line or "timed out" in first_line:
        return " (a collective waited the whole --timeout-s: the ranks disagree on their collectives, or one rank hung)"
    if precision != "fp32" and any(text in first_line for text in DTYPE_MIX):
        return (
            f" (under this {precision} plan an op met tensors of two dtypes: most often a tensor the model makes in "
            "fp32, such as torch.zeros(...) without dtype=, beside an activation in the low dtype; make it in the "
            "activation's dtype (dtype=x.dtype), or plan with --fix precision=fp32)"
        )
    return ""
