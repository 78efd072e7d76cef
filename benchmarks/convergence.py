"""Local SGD, DiLoCo, PowerSGD and top-k against synchronous training: convergence and step time on two gloo ranks.

Every case trains the same GPT from the same initial weights on the same batches as benchmarks/compression.py
(examples/gpt.py at 2 layers, hidden 128, vocabulary 512, 64 tokens; a pool of 64 sequences the model
memorises), through ``autoplan.parallelize`` under a dp=2 plan, AdamW lr 1e-3 inside, for ``--steps`` steps.
The cases are one table, :data:`CASES` (label -> Plan fields), so other options (top-k) add a row:

- ``synchronous``: every gradient all-reduced every step;
- ``DiLoCo H=...``: the replicas train apart and average every H steps, the outer Nesterov SGD at DiLoCo's lr 0.7,
  momentum 0.9 on the averaged delta (types/local_sgd.py);
- ``local SGD H=16``: plain averaging every 16 steps (post-local SGD's H, Lin et al. ICLR 2020);
- ``PowerSGD r2``: rank-2 compression with error feedback (the existing lossy option);
- ``top-k ...``: top-k sparsification with error feedback at 1% and 10% of each bucket (DGC, Lin et al. 2018;
  cost/dp/topk.py).

Per case: the final loss (mean of the last 20 steps), the steps and tokens until the loss (a 10-step running
mean) first reaches the target, the synchronous run's running mean at half its steps, the cost model's step
time on the cpu-gloo profile, and the measured mean (the slower rank's: every H-th step carries the outer sync,
so the mean, not the median, is what the cost model amortises). For context, not fitted: DiLoCo
trains 8 replicas with H = 500 and communicates 500x less than synchronous data parallelism at a matching
perplexity on C4 (Douillard et al. 2023, arXiv:2311.08105); two replicas for a few hundred steps show the
direction of the trade, not its size at scale. Writes benchmarks/results/convergence.csv. About 3 minutes on
2 cores.

    python benchmarks/convergence.py [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from _results import write_results
from compression import GPT, LAST, MICRO_BATCH, MODEL, _train  # the same model, data and training loop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SYNCHRONOUS = "synchronous"
#: label -> Plan fields besides dp=2 (module docstring)
CASES = {
    SYNCHRONOUS: {},
    "DiLoCo H=4": {"sync_every": 4, "outer_optimizer": "nesterov"},
    "DiLoCo H=16": {"sync_every": 16, "outer_optimizer": "nesterov"},
    "DiLoCo H=64": {"sync_every": 64, "outer_optimizer": "nesterov"},
    "local SGD H=16": {"sync_every": 16},
    "PowerSGD r2": {"grad_compression": "powersgd", "powersgd_rank": 2},
    "top-k 1%": {"grad_compression": "topk", "topk_ratio": 0.01},
    "top-k 10%": {"grad_compression": "topk", "topk_ratio": 0.1},
}
WINDOW = 10  # steps in the running mean the target is read on


def _worker(rank: int, world: int, port: int, job: dict, messages) -> None:
    from autoplan.jobs.spawn import report

    report(messages, rank, lambda: _run_cases(rank, world, port, job))


def _run_cases(rank: int, world: int, port: int, job: dict) -> dict:
    import os

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update({f"AUTOPLAN_GPT_{k}": str(v) for k, v in GPT.items()})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return {label: _train(CASES[label], job["steps"]) for label in CASES}


def running_mean(losses: list[float]) -> list[float]:
    return [statistics.fmean(losses[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(losses))]


def steps_to(target: float, losses: list[float]) -> int | None:
    """The first step (1-based) whose running mean is at or below ``target``; None if none is."""
    return next((i + 1 for i, loss in enumerate(running_mean(losses)) if loss <= target), None)


def predicted_step_s(fields: dict) -> float:
    """The cost model's step time of the case's plan on the cpu-gloo profile (the model traced as planned)."""
    import os

    from autoplan.cost import CostModel
    from autoplan.modelfile import load_model_file
    from autoplan.profile import load_profile
    from autoplan.trace import trace
    from autoplan.types.plan import Plan

    os.environ.update({f"AUTOPLAN_GPT_{k}": str(v) for k, v in GPT.items()})
    model_file = load_model_file(MODEL)
    graph = trace(model_file.build(), model_file.inputs(MICRO_BATCH))
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=MICRO_BATCH, num_microbatches=1, **fields)
    return CostModel(graph, load_profile("cpu-gloo")).estimate(plan).step_time_s


def summary_rows(runs: dict, steps: int) -> list[dict]:
    target = running_mean(runs[SYNCHRONOUS]["losses"])[steps // 2 - 1]
    tokens_per_step = 2 * MICRO_BATCH * GPT["BLOCK_SIZE"]
    rows = []
    for label, run in runs.items():
        reached = steps_to(target, run["losses"])
        rows.append(
            {
                "case": label,
                "steps": steps,
                "final_loss": statistics.fmean(run["losses"][-LAST:]),
                "target_loss": target,
                "steps_to_target": reached,
                "tokens_to_target": reached * tokens_per_step if reached else None,
                "predicted_step_s": predicted_step_s(CASES[label]),
                "measured_step_s": statistics.fmean(run["times"][2:]),  # the outer syncs' stalls in, as priced
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    head = f"{'case':<16} {'final loss':>10} {'steps to target':>16} {'tokens':>9}"
    print(f"{head} {'predicted ms':>13} {'measured ms':>12}")
    for r in rows:
        reached = r["steps_to_target"] or "-"
        tokens = r["tokens_to_target"] or "-"
        print(
            f"{r['case']:<16} {r['final_loss']:>10.4f} {reached!s:>16} {tokens!s:>9} "
            f"{1e3 * r['predicted_step_s']:>13.2f} {1e3 * r['measured_step_s']:>12.1f}"
        )
    print(f"target loss: {rows[0]['target_loss']:.4f} (the synchronous run's {WINDOW}-step mean at half its steps)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    from autoplan.jobs.spawn import spawn_ranks

    job = {"steps": args.steps}
    runs = spawn_ranks(_worker, processes=2, args=(job,), timeout_s=3600, what="benchmarking convergence")[0]
    rows = summary_rows(runs, args.steps)
    print_table(rows)
    write_results(rows, "convergence")


if __name__ == "__main__":
    main()
