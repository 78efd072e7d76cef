"""How many plans per second CostModel.estimate prices for a 96-layer GPT-3 175B graph.

The planner calls estimate() for every candidate, so it must stay arithmetic: block
summaries are cached per distinct choice and reused across plans. This prints plans/s for a
sweep of distinct plans (cold cache: the first time each block choice is seen) and for a
re-priced sweep (warm cache), and writes benchmarks/results/cost_speed.csv.

    python benchmarks/cost_speed.py
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pandas as pd
from _results import write_results

from autoplan.cost import CostModel
from autoplan.profile import load_profile
from autoplan.types import Plan

HERE = Path(__file__).parent


def gpt3_graph():
    from published_runs import trace_gpt  # the Megatron-shaped GPT of the published-runs benchmark

    row = pd.Series(dict(run="gpt3-175b", layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200))
    return trace_gpt(row)


def plans(devices: int = 1024, batch: int = 1536) -> list[Plan]:
    out = []
    for tp, pp, mbs, zero, rc, sched in itertools.product(
        (1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2), (0, 1, 3), ("none", "selective", "full"), ("1f1b", "gpipe")
    ):
        dp = devices // (tp * pp)
        if dp * tp * pp != devices or batch % (dp * mbs):
            continue
        out.append(
            Plan(
                devices=devices,
                dp=dp,
                tp=tp,
                pp=pp,
                micro_batch_size=mbs,
                num_microbatches=batch // (dp * mbs),
                schedule=sched,
                zero_stage=zero,
                recompute=rc,
                precision="bf16",
                sequence_parallel=tp > 1,
            )
        )
    return out


def main() -> None:
    start = time.perf_counter()
    graph = gpt3_graph()
    trace_s = time.perf_counter() - start
    model = CostModel(graph, load_profile(HERE.parent / "profiles" / "dgx-a100.yaml"))
    candidates = plans()
    rows = []
    for label in ("cold", "warm"):
        start = time.perf_counter()
        for plan in candidates:
            model.estimate(plan)
        elapsed = time.perf_counter() - start
        rows.append(
            dict(
                cache=label,
                plans=len(candidates),
                seconds=round(elapsed, 3),
                plans_per_s=round(len(candidates) / elapsed),
            )
        )
    table = pd.DataFrame(rows)
    print(f"GPT-3 175B graph: {len(graph.nodes)} nodes, {len(graph.layers)} blocks, traced in {trace_s:.1f} s")
    print(table.to_string(index=False))
    write_results(table, "cost_speed")


if __name__ == "__main__":
    main()
