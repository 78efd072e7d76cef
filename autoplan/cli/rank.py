"""One rank of ``autoplan run``: ``python -m autoplan.cli.rank OPTIONS_JSON`` (what the launcher
starts per local process; autoplan/cli/execute.py), and what the executor is handed from here.

The executor depends on types, trace and jobs only (tests/unit/test_layout.py): what a rank needs
of the planner is computed or passed in from this layer. :func:`write_audit_prediction` writes
the audit's predicted side into the run folder before any rank starts; :func:`replan_for_world`
is the planner ``--elastic`` calls when the job has another number of ranks than the plan.
"""

from __future__ import annotations

import dataclasses
import sys

from autoplan.types.plan import Plan
from autoplan.types.run_options import RunOptions


def write_audit_prediction(opts: RunOptions, plan: Plan) -> None:
    """``RUNDIR/audit_predicted.json``: per pipeline stage, what the cost model predicts one rank
    sends, holds, computes and peaks at in one step (cost/volumes.py ``predict``, CostModel's
    ``stage_memory``), priced on the plan's profile (cpu-gloo when it names none)."""
    from autoplan.cost import CostModel, predict_volumes
    from autoplan.profile import load_profile
    from autoplan.trace import trace_model_file
    from autoplan.types.audit_prediction import PEAK, AuditPrediction, StageAuditPrediction

    graph = trace_model_file(opts.model, plan.micro_batch_size, routing=plan.routing)
    model = CostModel(graph, load_profile(plan.profile or "cpu-gloo"))
    peaks = _peaks(model, plan)
    predicted = []
    for stage, peak, balanced, busier in zip(predict_volumes(model, plan), peaks, *_balanced_peaks(model, plan, peaks)):
        per_row = {**stage.per_expert_row, PEAK: (busier - balanced) / stage.expert_rows} if stage.expert_rows else {}
        fields = {**vars(stage), "comm": dict(stage.comm), "per_expert_row": per_row}
        predicted.append(StageAuditPrediction(**fields, peak_bytes=peak, balanced_peak_bytes=balanced))
    AuditPrediction(plan=plan.describe(), stages=tuple(predicted)).save(opts.out)


def _peaks(model, plan: Plan) -> list[float]:
    """Each stage's predicted peak bytes (CostModel.stage_memory)."""
    stages, _tp_plan, _ctx = model.priced_stages(plan)
    return [memory.peak_bytes for memory in model.stage_memory(plan, stages)]


def _balanced_peaks(model, plan: Plan, peaks: list[float]) -> tuple[list[float], list[float]]:
    """Each stage's peak at balanced routing and at imbalance 2, the busiest rank's experts receiving twice the
    mean: the expert activations the peak holds are linear in the rows (cost/blocks.py), so the difference over
    the balanced rows is what a received row adds (types/audit_prediction.py); the plan's ``peaks`` without MoE."""
    if plan.routing is None:
        return peaks, peaks
    at = [dataclasses.replace(plan, routing=dataclasses.replace(plan.routing, imbalance=i)) for i in (1.0, 2.0)]
    return _peaks(model, at[0]), _peaks(model, at[1])


def replan_for_world(opts: RunOptions, plan: Plan, devices: int) -> Plan:
    """The best plan for ``devices`` ranks in place of ``plan`` (autoplan/solve/replan.py), with
    the audit's prediction for it when the run audits."""
    from autoplan.solve.replan import replan_plan

    best = replan_plan(model=opts.model, plan=plan, devices=devices)
    if opts.audit:
        write_audit_prediction(opts, best)
    return best


def profile_threads(plan: Plan) -> int | None:
    """The ``threads`` of the plan's profile, None when it names none or it cannot be read."""
    if not plan.profile:
        return None
    from autoplan.errors import AutoplanError
    from autoplan.profile import load_profile

    try:
        return load_profile(plan.profile).threads
    except (AutoplanError, ImportError):
        return None


def run_rank(opts: RunOptions) -> int:
    """This process as one rank of the job (the executor's runner, with the planner passed in)."""
    from autoplan.execute.job import runner

    return runner.main(opts, replan=replan_for_world)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    return run_rank(RunOptions.from_json(words[0]))


if __name__ == "__main__":
    from autoplan.execute.job.runner import exit_now

    exit_now(main())
