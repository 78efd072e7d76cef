"""Llama 3 405B on 16,384 H100s: HSDP against full sharding, for the same tp, pp and cp, with the dgx-h100 profile.

The layout is Llama 3's published one (Grattafiori et al. 2024, Table 4; benchmarks/published_cp_runs.csv row
``llama3-405b-16k-cp1-8k``): TP 8 with sequence parallelism, CP 1, PP 16 (1F1B), DP 128, 8K tokens, 16M tokens
a step (micro-batch 1, 16 micro-batches), bf16. Its FSDP kept the weights from forward to backward (ZeRO-2);
ZeRO-1 and 3 are priced beside it. For each ZeRO stage and recomputation, every HSDP split dp_replicate = R
(shard groups of S = 128 / R dp ranks, docs/cost-model.md "HSDP") is priced against full sharding (R = 1),
and the best fitting plan of each stage is printed with its exposed dp/ZeRO sync and peak memory. Nothing is
fitted. Writes benchmarks/results/hsdp_405b.csv.

    python benchmarks/hsdp_405b.py
"""

from __future__ import annotations

import os
from pathlib import Path

from _results import write_results

SIZES = dict(N_LAYERS=126, DIM=16384, N_HEADS=128, N_KV_HEADS=8, FFN_DIM=53248, VOCAB_SIZE=128256, SEQ_LEN=8192)
LAYOUT = dict(devices=16384, dp=128, tp=8, pp=16, micro_batch_size=1, num_microbatches=16, sequence_parallel=True)
REPLICAS = (1, 2, 4, 8, 16, 32, 64)  # every split leaving 2 or more ranks per shard group
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama.py"


def rows() -> list[dict]:
    for key, value in SIZES.items():
        os.environ[f"AUTOPLAN_LLAMA_{key}"] = str(value)
    from autoplan.cost import CostModel
    from autoplan.profile import load_profile
    from autoplan.trace import trace_model_file
    from autoplan.types import Plan

    model = CostModel(trace_model_file(EXAMPLE, 1), load_profile("dgx-h100"))
    out = []
    for zero in (1, 2, 3):
        for recompute in ("selective", "full"):
            for replicas in REPLICAS:
                plan = Plan(**LAYOUT, zero_stage=zero, recompute=recompute, dp_replicate=replicas, precision="bf16")
                cost = model.estimate(plan)
                out.append(
                    dict(
                        zero=zero,
                        recompute=recompute,
                        dp_replicate=replicas,
                        dp_shard=128 // replicas,
                        step_time_s=cost.step_time_s,
                        sync_exposed_s=cost.dp_comm_exposed_s + cost.zero_comm_s,
                        peak_gib=cost.peak_memory_bytes / 2**30,
                        fits=cost.feasible,
                        mfu=cost.mfu,
                    )
                )
    return out


def main() -> None:
    table = rows()
    for row in table:
        print(
            f"zero={row['zero']} {row['recompute']:9s} R={row['dp_replicate']:2d} x S={row['dp_shard']:3d}: "
            f"step {row['step_time_s']:.3f} s, sync exposed {1e3 * row['sync_exposed_s']:.0f} ms, "
            f"{row['peak_gib']:.1f} GiB{'' if row['fits'] else ' (does not fit)'}"
        )
    write_results(table, "hsdp_405b")


if __name__ == "__main__":
    main()
