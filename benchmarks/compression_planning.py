"""When does lossy gradient sync pay? The planner with and without ``--allow-lossy`` on a slow
and on fast inter-node links (issue 17 (c)).

For GPT models of 125M, 350M and 1.3B parameters (examples/gpt.py at GPT-2/GPT-3 sizes, seq
1024, 4 sequences per device) on 16 and 64 devices of three profiles:

- aws-p3: V100 nodes joined by 25 Gbit/s Ethernet (3 GB/s modelled bus bandwidth);
- aws-p4d: A100 nodes on 400 Gbit/s EFA (37.6 GB/s, fitted to published nccl-tests);
- dgx-a100: A100 nodes on 8 x 200 Gbit/s InfiniBand;

it plans twice, exact gradient sync only and with lossy options allowed, and reports both
plans, the predicted speed-up, and what the lossy plan trades (bytes sent, compression compute,
extra memory). Predictions only: nothing here ran on those clusters.

    python benchmarks/compression_planning.py      # ~2 minutes on 2 cores; writes results/compression_planning.csv
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from _results import write_results

from autoplan.cost import CostModel
from autoplan.profile import load_profile
from autoplan.report.trade import trade_rows
from autoplan.solve.api import plan_graph
from autoplan.trace import trace_model_file

ROOT = Path(__file__).resolve().parent.parent
MODELS = {  # GPT-2 small / medium, GPT-3 XL (Radford et al. 2019; Brown et al. 2020 Table 2.1)
    "gpt-125m": dict(N_LAYER=12, N_EMBD=768, N_HEAD=12),
    "gpt-350m": dict(N_LAYER=24, N_EMBD=1024, N_HEAD=16),
    "gpt-1.3b": dict(N_LAYER=24, N_EMBD=2048, N_HEAD=16),
}
PROFILES = ("aws-p3", "aws-p4d", "dgx-a100")
DEVICES = (16, 64)
PER_DEVICE_BATCH = 4


def trace(name: str, batch: int):
    os.environ.update({f"AUTOPLAN_GPT_{k}": str(v) for k, v in MODELS[name].items()})
    os.environ.update(AUTOPLAN_GPT_VOCAB_SIZE="50304", AUTOPLAN_GPT_BLOCK_SIZE="1024")
    return trace_model_file(ROOT / "examples" / "gpt.py", batch)


def row(name: str, profile_name: str, devices: int) -> dict:
    batch = PER_DEVICE_BATCH * devices
    graph, profile = trace(name, batch), load_profile(profile_name)
    exact = plan_graph(graph, devices=devices, profile=profile, batch_size=batch).best
    lossy = plan_graph(graph, devices=devices, profile=profile, batch_size=batch, allow_lossy=True).best
    trade = {r.option: r for r in trade_rows(CostModel(graph, profile), lossy, allowed={"lossy"})}
    chosen = next(r for r in trade.values() if r.chosen)
    return {
        "model": name,
        "params_m": round(graph.param_count / 1e6),
        "profile": profile_name,
        "devices": devices,
        "exact_plan": exact.describe(),
        "exact_step_ms": 1e3 * exact.predicted.step_time_s,
        "lossy_plan": lossy.describe(),
        "lossy_step_ms": 1e3 * lossy.predicted.step_time_s,
        "speedup": exact.predicted.step_time_s / lossy.predicted.step_time_s,
        "lossy_choice": ", ".join(lossy.lossy) or "none",
        "grad_mb_sent": chosen.grad_bytes_sent / 1e6,
        "compression_ms": 1e3 * chosen.compression_s,
        "peak_gib": chosen.peak_memory_bytes / 2**30,
    }


def main() -> None:
    rows = [row(m, p, d) for m in MODELS for p in PROFILES for d in DEVICES]
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 60):
        print(table.round(2).to_string(index=False))
    write_results(table, "compression_planning")


if __name__ == "__main__":
    main()
