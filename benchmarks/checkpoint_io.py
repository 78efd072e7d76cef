"""Checkpoint I/O: save and load time against checkpoint size, and what async saving costs a step.

Everything runs on two gloo ranks (one thread each) of this machine, through the executor's
own :class:`~autoplan.execute.checkpoint.manager.Checkpointer` (torch.distributed.checkpoint on
a gloo group of its own), on the GPT of examples/gpt.py resized with AUTOPLAN_GPT_* overrides,
under a dp=2 plan (``--zero`` sets its ZeRO stage; default 0, DDP), one sequence per rank.

1. Size sweep. For each size, one training step (so AdamW has its moments), then ``--repeats``
   times: a synchronous save (``Checkpointer.save``, ``async_save=False``; DCP fsyncs its
   files), an asynchronous save split into its blocking part (``save`` returning: staging the
   state to host memory) and the rest (``wait``), and a load of the newest checkpoint
   (``Checkpointer.load``, after ``store.find_checkpoint`` / ``read_info``). Each time is the
   slowest rank's (all-reduce MAX) after a barrier; the table gives the median over repeats.
   Bytes are the step directory's files on disk; MB/s = bytes / time (MB = 1e6 bytes). The
   predicted bytes are the cost model's ``autoplan.cost.run.reliability.checkpoint_bytes`` (12 bytes
   per parameter: fp32 weights and AdamW's two moments; parameters counted once, the tied head
   included once); the ratio's excess over 1 is DCP's metadata, the per-parameter ``step``
   scalars, the RNG states and ``autoplan.json``. The load reads files just written, so it
   reads the page cache, not the disk: a load after a restart on another node is slower.
2. Step time. For one size (``--async-size``), ``--steps`` timed steps per mode (after two
   untimed) with no checkpoint, with a synchronous save every ``--every`` steps, and with an
   asynchronous one, in ``--rounds`` blocks per mode taken in turn, so drift in the machine's
   load hits all three alike. A step's time is the wall time around ``train_step`` plus the
   ``save`` call when one is due (for async: staging the state to host memory, and waiting for
   the previous save if it is still writing), the slowest rank's. The table gives median and
   mean step time and their ratios to the no-checkpoint median (the mean's ratio is the
   amortised overhead; the median's shows whether a background write slows the steps it
   overlaps: here the writer thread shares its rank's one core), the median ``save`` call, and
   the median drain (``wait`` at the end of a block: what is still writing; a run's end pays it
   once).

Prints two tables; writes benchmarks/results/checkpoint_io.csv (sizes) and
benchmarks/results/checkpoint_io_async.csv (step time). About 3 minutes on a 2-core machine.

    python benchmarks/checkpoint_io.py [--sizes xs,s,m,l] [--repeats 3] [--async-size m]
        [--steps 20] [--every 5] [--rounds 2] [--zero 0] [--tmp /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _results import write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "examples/gpt.py"
# name -> (n_layer, n_embd, n_head, vocab_size, block_size): ~11 MB, ~64 MB, ~330 MB, ~1 GB checkpoints
SIZES = {
    "xs": (2, 128, 4, 4096, 128),
    "s": (4, 256, 4, 8192, 128),
    "m": (6, 512, 8, 16384, 128),
    "l": (8, 768, 12, 32000, 128),
}
RECORD = {"model_file": str(MODEL), "model_sha256": "benchmark", "seed": 0, "global_batch_size": 2}


def gpt_env(size: str) -> dict[str, str]:
    n_layer, n_embd, n_head, vocab, block = SIZES[size]
    values = {"N_LAYER": n_layer, "N_EMBD": n_embd, "N_HEAD": n_head, "VOCAB_SIZE": vocab, "BLOCK_SIZE": block}
    return {f"AUTOPLAN_GPT_{k}": str(v) for k, v in values.items()}


def predicted_bytes(params: int) -> float:
    try:
        from autoplan.cost.run.reliability import checkpoint_bytes
    except ImportError:  # older tree: the same rule by hand
        return 12.0 * params
    return checkpoint_bytes(params=params)


# ---- inside a rank ---------------------------------------------------------------------------


def _setup(rank: int, world: int, port: int, job: dict):
    """Process group, model and trainer; (trainer, x, y, parameter count)."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update(gpt_env(job["size"]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from autoplan.execute import parallelize
    from autoplan.modelfile import load_model_file
    from autoplan.types.plan import Plan

    model_file = load_model_file(MODEL)
    plan = Plan(devices=2, dp=2, tp=1, pp=1, zero_stage=job["zero"], micro_batch_size=1, num_microbatches=1)
    torch.manual_seed(0)
    model = model_file.build()
    params = sum(p.numel() for p in model.parameters())  # a tied weight once
    trainer = parallelize(model, plan, loss_fn=model_file.loss, microbatch_inputs=model_file.inputs(1))
    torch.manual_seed(1)
    inputs, target = model_file.inputs(plan.global_batch_size), model_file.target(plan.global_batch_size)
    x, y = trainer.local_batch(inputs, target)
    return trainer, x, y, params


def _slowest(seconds: float) -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def _timed(fn) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    fn()
    return _slowest(time.perf_counter() - start)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _size_job(trainer, x, y, job: dict) -> dict:
    """Sync save, async save (blocking part, rest) and load times, repeated; bytes on disk."""
    from autoplan.execute.checkpoint import store
    from autoplan.execute.checkpoint.manager import Checkpointer

    trainer.train_step(x, y)
    root = Path(job["root"])
    sync = Checkpointer(root=root / "sync", every=0, async_save=False, keep=2, record=RECORD)
    background = Checkpointer(root=root / "async", every=0, async_save=True, keep=2, record=RECORD)
    times: dict[str, list[float]] = {"save_s": [], "async_block_s": [], "async_rest_s": [], "load_s": []}
    for repeat in range(1, job["repeats"] + 1):
        times["save_s"].append(_timed(lambda: sync.save(trainer, steps_done=repeat, rows=[])))
        times["async_block_s"].append(_timed(lambda: background.save(trainer, steps_done=repeat, rows=[])))
        times["async_rest_s"].append(_timed(background.wait))
        step_dir = store.find_checkpoint(root / "sync")
        info = store.read_info(step_dir)
        times["load_s"].append(_timed(lambda: sync.load(trainer, step_dir, info)))
    result = {key: statistics.median(values) for key, values in times.items()}
    result["bytes"] = _dir_bytes(store.find_checkpoint(root / "sync"))
    return result


def _async_job(trainer, x, y, job: dict) -> dict:
    """Per-step times (slowest rank) with no, sync and async checkpoints every ``every`` steps,
    in ``rounds`` blocks per mode taken in turn (so drift in machine load hits all three alike)."""
    import torch
    import torch.distributed as dist

    from autoplan.execute.checkpoint.manager import Checkpointer

    savers = {
        mode: Checkpointer(
            root=Path(job["root"]) / mode, every=job["every"], async_save=mode == "async", keep=2, record=RECORD
        )
        for mode in ("sync", "async")
    }
    savers["none"] = None
    for _ in range(2):  # warm-up, untimed
        trainer.train_step(x, y)
    out = {mode: {"steps": [], "calls": [], "waits": []} for mode in ("none", "sync", "async")}
    per_round = job["steps"] // job["rounds"]
    for block in range(job["rounds"]):
        for mode, record in out.items():
            saver = savers[mode]
            for step in range(block * per_round + 1, (block + 1) * per_round + 1):
                start = time.perf_counter()
                trainer.train_step(x, y)
                if saver is not None and saver.due(step):
                    before = time.perf_counter()
                    saver.save(trainer, steps_done=step, rows=[])
                    record["calls"].append(time.perf_counter() - before)
                record["steps"].append(time.perf_counter() - start)
            drain = time.perf_counter()  # the end of the block: finish the save in flight
            if saver is not None:
                saver.wait()
            record["waits"].append(time.perf_counter() - drain)
    for record in out.values():  # the slowest rank's, element by element
        for key, values in record.items():
            tensor = torch.tensor(values or [0.0], dtype=torch.float64)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            record[key] = tensor.tolist() if values else []
    return out


def _worker(rank: int, world: int, port: int, job: dict, messages) -> None:
    from autoplan.jobs.spawn import report

    report(messages, rank, lambda: _run_job(rank, world, port, job))


def _run_job(rank: int, world: int, port: int, job: dict) -> dict:
    trainer, x, y, params = _setup(rank, world, port, job)
    value = _size_job(trainer, x, y, job) if job["kind"] == "size" else _async_job(trainer, x, y, job)
    value["params"] = params
    return value


def run_job(job: dict, tmp: str) -> dict:
    """``job`` on two spawned ranks in a fresh checkpoint folder under ``tmp``; rank 0's value."""
    from autoplan.jobs.spawn import spawn_ranks  # noqa: F401 (below)

    root = tempfile.mkdtemp(prefix="autoplan-ckpt-bench-", dir=tmp)
    try:
        what = f"benchmarking checkpoints ({job['kind']}, size {job['size']})"
        return spawn_ranks(_worker, processes=2, args=({**job, "root": root},), timeout_s=600, what=what)[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- tables ----------------------------------------------------------------------------------


def size_row(size: str, zero: int, value: dict) -> dict:
    predicted = predicted_bytes(value["params"])
    mb = value["bytes"] / 1e6
    return {
        "size": size,
        "layers_embd_vocab": "x".join(str(v) for v in SIZES[size][:2] + SIZES[size][3:4]),
        "zero_stage": zero,
        "params": value["params"],
        "checkpoint_mb": mb,
        "predicted_mb": predicted / 1e6,
        "measured_over_predicted": value["bytes"] / predicted,
        "save_s": value["save_s"],
        "save_mb_per_s": mb / value["save_s"],
        "load_s": value["load_s"],
        "load_mb_per_s": mb / value["load_s"],
        "async_block_s": value["async_block_s"],
        "async_total_s": value["async_block_s"] + value["async_rest_s"],
    }


def async_rows(size: str, every: int, value: dict) -> list[dict]:
    base = statistics.median(value["none"]["steps"])
    rows = []
    for mode in ("none", "sync", "async"):
        data = value[mode]
        median, mean = statistics.median(data["steps"]), statistics.mean(data["steps"])
        calls = data["calls"]
        rows.append(
            {
                "size": size,
                "checkpoint": mode,
                "every": every if mode != "none" else 0,
                "steps": len(data["steps"]),
                "saves": len(calls),
                "median_step_s": median,
                "mean_step_s": mean,
                "median_ratio": median / base,
                "mean_ratio": mean / base,
                "median_save_call_s": statistics.median(calls) if calls else 0.0,
                "median_drain_s": statistics.median(data["waits"]),
            }
        )
    return rows


def print_table(rows: list[dict], columns: dict[str, str]) -> None:
    """``columns``: key -> format spec; one line per row, right-aligned under its header."""
    widths = {key: max(len(key), 10) + 2 for key in columns}
    print("".join(f"{key:>{widths[key]}}" for key in columns))
    for row in rows:
        print("".join(f"{format(row[key], spec):>{widths[key]}}" for key, spec in columns.items()))


SIZE_COLUMNS = {
    "size": "",
    "params": ",",
    "checkpoint_mb": ".1f",
    "measured_over_predicted": ".4f",
    "save_s": ".3f",
    "save_mb_per_s": ".0f",
    "load_s": ".3f",
    "load_mb_per_s": ".0f",
    "async_block_s": ".3f",
    "async_total_s": ".3f",
}
ASYNC_COLUMNS = {
    "checkpoint": "",
    "every": "d",
    "saves": "d",
    "median_step_s": ".4f",
    "mean_step_s": ".4f",
    "median_ratio": ".3f",
    "mean_ratio": ".3f",
    "median_save_call_s": ".3f",
    "median_drain_s": ".3f",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="xs,s,m,l", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--async-size", default="m", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="blocks per mode, taken in turn")
    parser.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where checkpoints are written (then removed)")
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size {unknown[0]!r}; choose from {', '.join(SIZES)}")
    rows = []
    for size in sizes:
        job = {"kind": "size", "size": size, "zero": args.zero, "repeats": args.repeats}
        rows.append(size_row(size, args.zero, run_job(job, args.tmp)))
        print(f"  size {size}: {rows[-1]['checkpoint_mb']:.1f} MB, save {rows[-1]['save_s']:.3f} s", flush=True)
    print(f"\nCheckpoint save / load vs size (dp=2, zero {args.zero}, 2 gloo ranks, median of {args.repeats})")
    print_table(rows, SIZE_COLUMNS)
    write_results(rows, "checkpoint_io")
    job = {
        "kind": "async",
        "size": args.async_size,
        "zero": args.zero,
        "steps": args.steps,
        "every": args.every,
        "rounds": args.rounds,
    }
    steps = async_rows(args.async_size, args.every, run_job(job, args.tmp))
    print(f"\nStep time with checkpoints every {args.every} steps (size {args.async_size}, {args.steps} steps)")
    print_table(steps, ASYNC_COLUMNS)
    write_results(steps, "checkpoint_io_async")


if __name__ == "__main__":
    main()
