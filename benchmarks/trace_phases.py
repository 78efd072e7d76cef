"""User CPU seconds of one trace, by phase (docs/trace.md, "Where a trace's time goes"): torch._dynamo's
import, then trace_model_file with its steps timed in place (each phase's functions wrapped; a phase
is its functions' CPU time, the rows named "the rest" what is left of the step around them), then the
Graph to JSON text. Usage: python benchmarks/trace_phases.py MODEL.py BATCH (sizes from the model's env
vars, as `autoplan trace` reads them)."""

from __future__ import annotations

import argparse
import functools
import json
import resource
from collections import Counter

spent: Counter = Counter()
calls: Counter = Counter()


def user_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def timed(owner: object, name: str, label: str) -> None:
    """Replace ``owner.name`` with a wrapper that adds its user CPU seconds to ``spent[label]``."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = user_s()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += user_s() - start
            calls[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    args = parser.parse_args()
    import torch  # noqa: F401  (torch itself is not a phase: every trace and plan imports it)

    start = user_s()
    import torch._dynamo  # noqa: F401

    spent["dynamo"] = user_s() - start
    import torch.export

    from autoplan.trace import api, capture, memo, propagate

    for owner, name, label in [
        (api, "load_model_file", "load"),
        (api, "trace", "trace"),
        (api, "capture", "capture"),
        (torch.export, "export", "export"),
        (capture, "stitch", "stitch"),
        (api, "_run", "run"),
        (propagate.Propagator, "_measure", "real"),
        (memo, "replay", "replay"),
        (propagate.Propagator, "_memo_key", "keys"),
    ]:
        timed(owner, name, label)
    start = user_s()
    graph = api.trace_model_file(args.model, args.batch)
    total = user_s() - start
    start = user_s()
    json.dumps(graph.to_dict())
    spent["json"] = user_s() - start
    propagation = spent["run"] - spent["real"] - spent["replay"] - spent["keys"]
    rows = [
        ("import torch._dynamo", spent["dynamo"]),
        ("loading the model file", spent["load"]),
        ("building the model and inputs on meta", total - spent["load"] - spent["trace"]),
        ("capture: the torch.fx try, finding the blocks", spent["capture"] - spent["export"] - spent["stitch"]),
        ("capture: exporting the first blocks", spent["export"]),
        ("capture: stitching the rest", spent["stitch"]),
        (f"propagation: calls measured for real ({calls['real']})", spent["real"]),
        (f"propagation: replayed calls ({calls['replay']})", spent["replay"]),
        ("propagation: call keys", spent["keys"]),
        ("propagation: the rest", propagation),
        ("the rest of trace(): swaps, dataflow, blocks, the Graph", spent["trace"] - spent["capture"] - spent["run"]),
        ("the Graph to JSON text", spent["json"]),
        (f"total ({len(graph.nodes)} nodes)", total + spent["dynamo"] + spent["json"]),
    ]
    for label, seconds in rows:
        print(f"{seconds:7.2f}  {label}")


if __name__ == "__main__":
    main()
