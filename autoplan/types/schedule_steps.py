"""Gradient accumulation outside the pipeline schedule (``Plan.schedule_steps``; docs/plan-format.md,
docs/cost-model.md "Schedule steps").

torch.distributed.pipelining runs one schedule step over the micro-batches it is given, with one receive
buffer per micro-batch and every send held until the step's last action (cost/pp/rank_memory.py), so
frameworks built on it accumulate gradients over several schedule steps per optimizer step: torchtitan's
``global_batch_size`` over ``local_batch_size`` x dp, NeMo AutoModel's "GA". With k = ``schedule_steps``
the plan's ``num_microbatches`` m stays the micro-batches of one optimizer step (the global batch is
``dp * micro_batch_size * m`` as before) and each of the k schedule steps runs m / k of them, which must
meet the schedule's own micro-batch rules (types/schedules.py). k > 1 needs a pipeline (at pp = 1 the
micro-batches already accumulate one by one) and a runtime that runs torch's schedules (``TORCH_PIPELINES``).
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import PlanError
from autoplan.types.schedules import TORCH_PIPELINES


def step_microbatches(plan: Any) -> int:
    """m / k: the micro-batches one schedule step runs."""
    return plan.num_microbatches // plan.schedule_steps


def schedule_step_plan(plan: Any) -> Any:
    """The plan of one schedule step: ``plan`` with m / k micro-batches and one step (``plan`` itself at
    k = 1). Whatever a schedule's shape sets (its bubble, fill and drain, in-flight activations, receive
    buffers, held sends, re-runs per micro-batch) is priced on this plan, k times per optimizer step."""
    if plan.schedule_steps == 1:
        return plan
    step = type(plan).__new__(type(plan))  # a copy of its fields, as dataclasses.replace makes it, unchecked:
    step.__dict__.update(plan.__dict__)  # m / k meets the rules k's plan was checked against (or is a search's
    step.num_microbatches, step.schedule_steps = step_microbatches(plan), 1  # unchecked member, made by those rules)
    return step


def check_schedule_steps(plan: Any) -> None:
    """``schedule_steps`` is a whole number of schedule steps that divides the micro-batches, on a pipeline
    run by torch's schedules (module docstring); one sentence naming the rule otherwise."""
    k, m = plan.schedule_steps, plan.num_microbatches
    if not (isinstance(k, int) and k >= 1):
        raise PlanError(f"plan schedule_steps={k!r}; expected an integer >= 1.")
    if k == 1:
        return
    if m % k:
        raise PlanError(
            f"plan schedule_steps={k} does not divide num_microbatches={m}: each schedule step runs "
            "num_microbatches / schedule_steps micro-batches; use a divisor of num_microbatches."
        )
    if plan.pp == 1:
        raise PlanError(
            f"plan schedule_steps={k} with pp=1: without a pipeline the micro-batches already accumulate one "
            "by one; use schedule_steps=1 (num_microbatches is the accumulation)."
        )
    if plan.runtime not in TORCH_PIPELINES:
        raise PlanError(
            f"plan schedule_steps={k} with runtime '{plan.runtime}': only runtimes that run torch's pipeline "
            f"schedules ({', '.join(TORCH_PIPELINES)}) accumulate over several schedule steps; use schedule_steps=1."
        )
