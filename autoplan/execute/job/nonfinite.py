"""Stop a run at its first non-finite loss, on every rank, with one sentence and exit code 4
(``EXIT_NONFINITE_LOSS``, autoplan/execute/job/contract.py).

The check costs nothing: each step's loss is already all-reduced to every rank for measured.csv
(``Trainer.reduce_loss``: the ranks that hold the last pipeline stage give theirs, the others 0),
and NaN or inf survives the sum, so every rank reads the same non-finite value at the same step
and stops there together, pipeline ranks that never see the loss included. Nothing waits on a
collective that a stopped peer will not join.

Under fp16 the loss scaler skips a step whose *gradients* overflow (execute/grad_scaler.py):
that step's loss is finite and the run goes on, as it should. A non-finite *loss* is never the
scaler's business: the forward itself overflowed or divided by zero, and lowering the scale
cannot fix it, so it stops the run in every precision.

The weights after such a step hold NaN or inf, so no final checkpoint is written (a save already
in flight is waited for); rank 0 writes the run folder with the steps so far, the failing one
last, and ``summary.json`` names it (``nonfinite_loss``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch.distributed as dist

#: What can push a loss out of range, per plan precision (the cause the precision adds).
PRECISION_CAUSES = {
    "fp16": "activations beyond fp16's largest value, 65504 (try --fix precision=bf16)",
    "bf16": "bf16's coarse rounding in a sensitive op (compare with --fix precision=fp32)",
    "fp8": "an FP8 scale that overflowed (compare with --fix precision=bf16)",
}


def is_finite(loss: float) -> bool:
    return math.isfinite(loss)


def message(*, step: int, loss: float, precision: str) -> str:
    """One sentence: the step, the value, and the likely causes."""
    causes = [
        "NaN or inf in the model's inputs, targets or initial weights",
        "an op that divides by zero or takes the log or square root of zero or a negative number",
        "training that diverged",
    ]
    if precision in PRECISION_CAUSES:
        causes.insert(2, PRECISION_CAUSES[precision])
    return (
        f"the loss of step {step} (counted from 0, as in measured.csv) is {loss}, so the run stopped there on "
        f"every rank; likely causes: {'; '.join(causes)}."
    )


def summary_entry(row: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s ``nonfinite_loss``: the step and the value as text (JSON has no NaN)."""
    return {"step": row["step"], "loss": str(row["loss"])}


def announce(*, row: dict[str, Any], precision: str) -> None:
    """Rank 0 prints the sentence, as the command line prints every error; every rank also records
    it where a launcher looks for a failed rank's reason (under torchelastic's agent, exit 4 is a
    failure like any other, and its last message then names this cause)."""
    from autoplan.errors import RunError
    from autoplan.execute.job.runner import record_failure

    sentence = message(step=row["step"], loss=row["loss"], precision=precision)
    record_failure(RunError(sentence))
    if dist.get_rank() == 0:
        print(f"autoplan: error: {sentence}", file=sys.stderr)
        sys.stderr.flush()
