"""A plan folder and a run folder of the synthetic GPT, written as `autoplan plan` and `autoplan run`
write them (the report tests read them back)."""

from __future__ import annotations

import numpy as np

from autoplan.solve.api import plan_graph
from autoplan.solve.outputs import write_outputs
from autoplan.types.run_folder import MeasuredStep, RunSummary, write_run_folder
from synthetic.graphs import synthetic_gpt
from synthetic.profiles import synthetic_profile

#: the run folder's measured step times: two warm-up steps, then about 0.3 s
STEP_TIMES = [0.5, 0.31, 0.3, 0.29, 0.3, 0.32]


def write_plan_folder(path, *, fix):
    """Plan the 4-block synthetic GPT on 8 synthetic A100s (batch 16) with ``fix``; return the SearchResult."""
    graph = synthetic_gpt(layers=4, hidden=512, heads=8, batch=16, seq=256)
    profile = synthetic_profile()
    result = plan_graph(graph, devices=8, profile=profile, batch_size=16, fix=fix)
    write_outputs(path, result=result, graph=graph, profile=profile)
    return result


def write_measured_run(path, plan) -> float:
    """A run folder of ``plan`` with :data:`STEP_TIMES`; return its median step time after warm-up."""
    steps = [MeasuredStep(i, t, 5.0 - 0.1 * i, 1000 + i) for i, t in enumerate(STEP_TIMES)]
    median = float(np.median(STEP_TIMES[2:]))
    write_run_folder(
        path,
        steps=steps,
        plan=plan,
        summary=RunSummary(
            plan=plan.describe(),
            steps=len(STEP_TIMES),
            warmup_steps=2,
            median_step_time_s=median,
            predicted_step_time_s=plan.predicted.step_time_s,
            peak_memory_bytes=1005,
            peak_memory_kind="cpu_max_rss",
            final_loss=4.5,
        ),
    )
    return median
