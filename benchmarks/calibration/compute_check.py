"""Which compute term is off? One process, the profile's threads, forward + backward of a model, per op class.

Measured: torch.profiler self CPU time of one forward + backward (median of several steps),
grouped into matmul (aten mm/addmm/bmm/linear backward matmuls), attention (SDPA kernels) and
everything else (element-wise, norms, softmax, embedding, loss, autograd bookkeeping).
Predicted: the cost model's op_time_s (autoplan/cost/compute/roofline.py) of every traced node, forward
and backward, grouped the same way by node kind. No communication is involved, so a gap here is
the compute term's alone.

    python -m benchmarks.calibration.compute_check [--model gpt|llama] [--mbs 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from autoplan.calibrate.runs import environment
from autoplan.cost.compute.roofline import op_time_s
from autoplan.modelfile import load_model_file
from autoplan.profile import load_profile
from autoplan.trace import trace_model_file
from benchmarks.calibration.run import MODELS, ROOT

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul")
ATTENTION_MARK = ("attention", "flash", "sdpa")


def op_class(name: str) -> str:
    if name in MATMUL_OPS:
        return "matmul"
    return "attention" if any(m in name.lower() for m in ATTENTION_MARK) else "other"


def predicted_by_class(graph, profile, *, mbs: int) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for node in graph.nodes:
        cls = {"linear": "matmul", "matmul": "matmul", "attention": "attention"}.get(node.op, "other")
        for backward in (False, True):
            out[cls] += op_time_s(
                node, profile, precision="fp32", batch_fraction=mbs / graph.batch_size, backward=backward
            )
    return dict(out)


def measured_by_class(model_file, *, mbs: int, steps: int) -> tuple[dict[str, float], float]:
    torch.manual_seed(0)
    model = model_file.build()
    inputs, target = model_file.inputs(mbs), model_file.target(mbs)
    step = lambda: model_file.loss(model(*inputs), target).backward()  # noqa: E731
    for _ in range(2):
        step()
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        walls.append(time.perf_counter() - start)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    out: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        out[op_class(event.key)] += event.self_cpu_time_total / 1e6 / steps
    return dict(out), statistics.median(walls)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", choices=sorted(MODELS))
    parser.add_argument("--mbs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--profile", default="cpu-gloo")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    torch.set_num_threads(profile.threads or 1)
    path, env = MODELS[args.model]
    with environment(tuple(env.items())):
        graph = trace_model_file(str(ROOT / path), 8)
        model_file = load_model_file(ROOT / path)
    predicted = predicted_by_class(graph, profile, mbs=args.mbs)
    measured, wall_s = measured_by_class(model_file, mbs=args.mbs, steps=args.steps)
    print(
        f"{args.model}, micro-batch {args.mbs}, fp32, {torch.get_num_threads()} thread(s): forward + backward seconds"
    )
    print(f"{'op class':12s}{'measured':>10s}{'predicted':>11s}{'meas/pred':>11s}")
    for cls in ("matmul", "attention", "other"):
        m, p = measured.get(cls, 0.0), predicted.get(cls, 0.0)
        print(f"{cls:12s}{m:10.4f}{p:11.4f}{(m / p if p else float('nan')):11.2f}")
    total_p = sum(predicted.values())
    total_m = sum(measured.values())
    print(f"{'total':12s}{total_m:10.4f}{total_p:11.4f}{total_m / total_p:11.2f}   (wall, no profiler: {wall_s:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
