"""Time the GPT-3 175B meta/fake trace (examples/gpt3_175b.py, batch 1536), print a table and
write benchmarks/results/trace_175b.csv. Usage: python benchmarks/trace_175b.py [--repeat N]"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import pandas as pd
from _results import write_results

from autoplan.trace import trace_model_file

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1536)
    args = parser.parse_args()
    rows = []
    for run in range(args.repeat):
        start = time.perf_counter()
        graph = trace_model_file(ROOT / "examples" / "gpt3_175b.py", args.batch)
        rows.append(
            {
                "run": run,
                "trace_s": round(time.perf_counter() - start, 3),
                "method": graph.trace_method,
                "nodes": len(graph.nodes),
                "layers": len(graph.layers),
                "groups": len(graph.groups),
                "params": graph.param_count,
                "step_flops": graph.step_flops,
                "saved_activation_bytes": sum(n.saved_bytes for n in graph.nodes),
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        )
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    write_results(table, "trace_175b")


if __name__ == "__main__":
    main()
