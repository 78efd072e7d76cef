"""Does a core compute as fast when the other ranks compute too? (evidence for the benchmark's closing note)

`autoplan profile` times matmuls and memory-bound ops in ONE process; a training run has all N
ranks computing at once. This measures, with the profile's thread count, the achieved fp32
matmul FLOP/s and `add` bandwidth of one process alone and of each of N processes running together.
A ratio below 1 is a slowdown the profile's compute numbers do not contain.

    python -m benchmarks.calibration.contention [--processes 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time


def _work(barrier, queue, threads: int, size: int, repeats: int) -> None:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    x, y = torch.randn(8 * 2**20), torch.randn(8 * 2**20)
    for _ in range(3):
        a @ b, x + y
    barrier.wait()
    matmul, add = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        matmul.append(time.perf_counter() - start)
        start = time.perf_counter()
        x + y
        add.append(time.perf_counter() - start)
    queue.put((2 * size**3 / statistics.median(matmul), 3 * x.numel() * 4 / statistics.median(add)))


def measure(processes: int, *, threads: int = 1, size: int = 512, repeats: int = 30) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_work, args=(barrier, queue, threads, size, repeats)) for _ in range(processes)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    return statistics.mean(r[0] for r in results), statistics.mean(r[1] for r in results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    alone = measure(1)
    together = measure(args.processes)
    print(f"{'':28s}{'alone':>12s}{f'{args.processes} at once':>14s}{'ratio':>8s}")
    print(
        f"{'fp32 matmul 512^3 GFLOP/s':28s}{alone[0] / 1e9:12.1f}{together[0] / 1e9:14.1f}{together[0] / alone[0]:8.2f}"
    )
    print(f"{'add 8M fp32 GB/s':28s}{alone[1] / 1e9:12.2f}{together[1] / 1e9:14.2f}{together[1] / alone[1]:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
