"""The audit's predicted side is written before the ranks start and read back by rank 0
(autoplan/types/audit_prediction.py): every number survives the file exactly, and a prediction
for another plan (a stale file) is refused in one sentence rather than compared. That the ranks
compare against it is tests/dist/test_execute_cli.py's `autoplan run --audit`."""

from __future__ import annotations

import pytest

from autoplan.errors import RunError
from autoplan.types.audit_prediction import AuditPrediction, StageAuditPrediction
from autoplan.types.plan import Plan

PLAN = Plan(devices=2, dp=1, tp=2, pp=1, micro_batch_size=1, num_microbatches=2)


def _stage(scale: float) -> StageAuditPrediction:
    comm = {("tp", "all_reduce"): [6, 1536.0 * scale], ("dp", "all_gather"): [None, 1 / 3 * scale]}
    return StageAuditPrediction(comm=comm, param_elements=0.1 * scale, forward_flops=3e12 / 7, peak_bytes=2**40 + 1)


def test_every_number_reads_back_exactly(tmp_path):
    written = AuditPrediction(plan=PLAN.describe(), stages=(_stage(1.0), _stage(2.0)))
    written.save(tmp_path)
    assert AuditPrediction.load(tmp_path, plan=PLAN.describe()) == written


def test_a_prediction_for_another_plan_or_none_is_one_sentence(tmp_path):
    with pytest.raises(RunError, match=r"audit_predicted.json' is missing; `autoplan run --audit` writes it\.$"):
        AuditPrediction.load(tmp_path, plan=PLAN.describe())
    AuditPrediction(plan=PLAN.describe(), stages=(_stage(1.0),)).save(tmp_path)
    other = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=1, num_microbatches=2).describe()
    with pytest.raises(RunError, match=r"predicts plan '.*', not the plan run \('.*'\)\.$"):
        AuditPrediction.load(tmp_path, plan=other)
