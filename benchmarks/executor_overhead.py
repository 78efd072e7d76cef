"""Executor overhead: the same dp=2 plan through autoplan and through a hand-written DDP loop.

Both run on the same two gloo processes, on the same model, batch and optimizer (AdamW),
alternating blocks of steps so drift in machine load hits both alike. Prints the median
step time of each and their ratio (target: autoplan / DDP <= 1.05) and writes
benchmarks/results/executor_overhead.csv.

    python benchmarks/executor_overhead.py [--model examples/mlp.py] [--steps 30] [--batch 32]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ddp_loop(model_file, x, y, steps: int) -> list[float]:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(model_file.build())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model_file.loss(model(*x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def _autoplan_loop(model_file, plan, x, y, steps: int) -> list[float]:
    from autoplan.execute import parallelize

    torch.manual_seed(0)
    trainer = parallelize(model_file.build(), plan, loss_fn=model_file.loss)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.train_step(x, y)
        times.append(time.perf_counter() - start)
    return times


def _worker(rank: int, args, port: int, queue) -> None:
    from autoplan.execute.batch import shard_batch
    from autoplan.modelfile import load_model_file
    from autoplan.types.plan import Plan

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model_file = load_model_file(args.model)
    plan = Plan(devices=2, dp=2, tp=1, pp=1, micro_batch_size=args.batch // 2, num_microbatches=1)
    torch.manual_seed(1)
    inputs, target = model_file.inputs(args.batch), model_file.target(args.batch)
    x = shard_batch(tuple(inputs), index=rank, parts=2, batch_size=args.batch)
    y = shard_batch(target, index=rank, parts=2, batch_size=args.batch)
    ours, theirs = [], []
    for _ in range(args.rounds):  # alternate, and drop each block's first (warm-up) step
        theirs += _ddp_loop(model_file, x, y, args.steps)[1:]
        ours += _autoplan_loop(model_file, plan, x, y, args.steps)[1:]
    if rank == 0:
        queue.put((ours, theirs))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "examples/mlp.py"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    from autoplan.jobs.launcher import free_port

    queue = mp.get_context("spawn").Queue()
    mp.start_processes(_worker, args=(args, free_port(), queue), nprocs=2, start_method="spawn")
    ours, theirs = queue.get()
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    ratio = ours_s / theirs_s
    print(f"{'loop':<22}{'median step_time_s':>20}{'steps':>8}")
    print(f"{'hand-written DDP':<22}{theirs_s:>20.6f}{len(theirs):>8}")
    print(f"{'autoplan parallelize':<22}{ours_s:>20.6f}{len(ours):>8}")
    print(f"ratio autoplan / DDP = {ratio:.3f} (target <= 1.05)")
    out = ROOT / "benchmarks/results/executor_overhead.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["model", "batch", "loop", "median_step_time_s", "steps", "ratio_to_ddp"])
        writer.writerow([Path(args.model).name, args.batch, "ddp", f"{theirs_s:.6f}", len(theirs), "1.000"])
        writer.writerow([Path(args.model).name, args.batch, "autoplan", f"{ours_s:.6f}", len(ours), f"{ratio:.3f}"])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
