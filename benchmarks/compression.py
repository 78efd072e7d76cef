"""Lossy gradient reduction and FP8: convergence and step time on two gloo ranks.

Every option trains the same GPT (examples/gpt.py resized with AUTOPLAN_GPT_* overrides: 2
layers, hidden 128, 4 heads, vocabulary 512, 64 tokens) from the same initial weights (seed 0)
on the same batches, through autoplan's own executor (``autoplan.parallelize`` under a dp=2 DDP
plan, one thread per rank, AdamW lr 1e-3), for ``--steps`` steps:

- ``fp32 reduce``: the uncompressed baseline (fp32 precision, fp32 all-reduce);
- ``bf16 reduce`` / ``fp16 reduce``: ``grad_reduce_dtype`` bf16 / fp16 (DDP comm hook);
- ``powersgd r1/r2/r4``: ``grad_compression="powersgd"`` at rank 1, 2, 4 (torch's hook, error
  feedback, compressing from step 2; autoplan/execute/data_parallel.py);
- ``bf16`` and ``fp8 (emulated)``: precision bf16 and fp8 (fp32 reduction). FP8 runs through
  ``torch._scaled_mm``'s CPU kernel under ``AUTOPLAN_FP8_EMULATE=1``: its losses are FP8's,
  its step time means nothing about FP8 hardware.

Data: a fixed pool of 64 random sequences (seed 0), taken 8 at a time in turn, which the model
memorises: the loss falls from ln V = 6.24 nats towards 0, so the options' curves can separate (a
stream of fresh random tokens would sit at ln V whatever the gradients).

Per option: the final loss (mean of the last 20 steps), its difference from the baseline's,
the largest |loss - baseline loss| over the run, and the median step time (wall time around
``train_step``, the slower rank's). Writes benchmarks/results/compression.csv (the table),
compression_curves.csv (every step's loss) and compression_curves.png (the loss curves and
their difference from the baseline). About 4 minutes on a 2-core machine.

    python benchmarks/compression.py [--steps 300] [--no-fp8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from _results import RESULTS, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "examples/gpt.py"
GPT = {"N_LAYER": 2, "N_EMBD": 128, "N_HEAD": 4, "VOCAB_SIZE": 512, "BLOCK_SIZE": 64}
MICRO_BATCH = 4  # sequences per rank and step
LR = 1e-3
POOL = 64  # sequences in the data pool
LAST = 20  # final loss: mean of the last LAST steps
BASELINE = "fp32 reduce"
#: label -> Plan fields (besides dp=2)
OPTIONS = {
    BASELINE: {},
    "bf16 reduce": {"grad_reduce_dtype": "bf16"},
    "fp16 reduce": {"grad_reduce_dtype": "fp16"},
    "powersgd r1": {"grad_compression": "powersgd", "powersgd_rank": 1},
    "powersgd r2": {"grad_compression": "powersgd", "powersgd_rank": 2},
    "powersgd r4": {"grad_compression": "powersgd", "powersgd_rank": 4},
    "bf16": {"precision": "bf16"},
    "fp8 (emulated)": {"precision": "fp8"},
}


def batch(step: int, size: int):
    """Batch ``step`` (module docstring): ``size`` sequences of the pool, in turn; (inputs, target)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    pool = torch.randint(0, GPT["VOCAB_SIZE"], (POOL, GPT["BLOCK_SIZE"] + 1), generator=gen)
    tokens = pool[(torch.arange(size) + step * size) % POOL]
    return (tokens[:, :-1].contiguous(),), tokens[:, 1:].contiguous()


# ---- inside a rank ---------------------------------------------------------------------------


def _slowest(seconds: float) -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def _train(fields: dict, steps: int) -> dict:
    """One option: losses and step times of ``steps`` steps through ``autoplan.parallelize``."""
    import torch

    from autoplan.execute import parallelize
    from autoplan.modelfile import load_model_file
    from autoplan.types.plan import Plan

    model_file = load_model_file(MODEL)
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=MICRO_BATCH, num_microbatches=1, **fields)
    torch.manual_seed(0)
    trainer = parallelize(
        model_file.build(),
        plan,
        loss_fn=model_file.loss,
        optimizer_fn=lambda params: torch.optim.AdamW(params, lr=LR, fused=True),
    )
    losses, times = [], []
    for step in range(steps):
        x, y = trainer.local_batch(*batch(step, plan.global_batch_size))
        start = time.perf_counter()
        loss = trainer.train_step(x, y)
        times.append(_slowest(time.perf_counter() - start))
        losses.append(trainer.reduce_loss(loss))
    return {"losses": losses, "times": times}


def _worker(rank: int, world: int, port: int, job: dict, messages) -> None:
    from autoplan.jobs.spawn import report

    report(messages, rank, lambda: _run_options(rank, world, port, job))


def _run_options(rank: int, world: int, port: int, job: dict) -> dict:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update({f"AUTOPLAN_GPT_{k}": str(v) for k, v in GPT.items()}, AUTOPLAN_FP8_EMULATE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return {label: _train(OPTIONS[label], job["steps"]) for label in job["options"]}


# ---- tables and figure -----------------------------------------------------------------------


def summary_rows(runs: dict, steps: int) -> list[dict]:
    base = runs[BASELINE]["losses"]
    rows = []
    for label, run in runs.items():
        final = statistics.fmean(run["losses"][-LAST:])
        rows.append(
            {
                "option": label,
                "steps": steps,
                "first_loss": run["losses"][0],
                "final_loss": final,
                "final_minus_baseline": final - statistics.fmean(base[-LAST:]),
                "max_abs_diff_vs_baseline": max(abs(a - b) for a, b in zip(run["losses"], base)),
                "median_step_time_s": statistics.median(run["times"][2:]),
            }
        )
    return rows


def curve_rows(runs: dict) -> list[dict]:
    base = runs[BASELINE]["losses"]
    return [
        {"option": label, "step": step, "loss": loss, "minus_baseline": loss - base[step]}
        for label, run in runs.items()
        for step, loss in enumerate(run["losses"])
    ]


def plot(runs: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = runs[BASELINE]["losses"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for label, run in runs.items():
        left.plot(run["losses"], label=label, linewidth=1)
        right.plot([a - b for a, b in zip(run["losses"], base)], label=label, linewidth=1)
    left.set(xlabel="step", ylabel="loss (nats)", title="training loss, 2 gloo ranks (DDP)")
    right.set(xlabel="step", ylabel="loss - fp32-reduce loss", title="difference from the uncompressed run")
    right.axhline(0.0, color="black", linewidth=0.5)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def print_table(rows: list[dict]) -> None:
    print(f"{'option':<16} {'final loss':>10} {'- baseline':>11} {'max |diff|':>11} {'median step ms':>15}")
    for r in rows:
        print(
            f"{r['option']:<16} {r['final_loss']:>10.4f} {r['final_minus_baseline']:>+11.4f} "
            f"{r['max_abs_diff_vs_baseline']:>11.4f} {1e3 * r['median_step_time_s']:>15.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-fp8", action="store_true", help="leave out the emulated fp8 run (the slow one)")
    args = parser.parse_args()
    from autoplan.jobs.spawn import spawn_ranks  # noqa: F401 (below)

    options = [o for o in OPTIONS if not (args.no_fp8 and "fp8" in o)]
    job = {"steps": args.steps, "options": options}
    runs = spawn_ranks(_worker, processes=2, args=(job,), timeout_s=3600, what="benchmarking compression")[0]
    rows = summary_rows(runs, args.steps)
    print_table(rows)
    write_results(rows, "compression")
    write_results(curve_rows(runs), "compression_curves")
    plot(runs, RESULTS / "compression_curves.png")


if __name__ == "__main__":
    main()
