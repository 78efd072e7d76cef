"""Time `autoplan trace` on two large models a new user brings, print a table and write
benchmarks/results/moe_loop_trace.csv. Usage: python benchmarks/moe_loop_trace.py [--repeat N]

- ``loop_mixtral_8x7b``: Mixtral 8x7B's shape (32 layers, hidden 4096, 8 experts of FFN 14336,
  top-2, vocabulary 32000, 8 x 4096 tokens) written as transformers 4.x wrote it, a loop over a
  ``ModuleList`` of experts (tests/odd_models/loop_moe.py): traced under the routing model.
- ``gpt3_late_branch``: GPT-3 175B (examples/_gpt_common.py) whose forward branches on tensor
  values after its 96 blocks (no MoE layer): refused in one sentence after one export.

Each trace runs as its own `python -m autoplan.cli trace` process; ``cpu_s`` is that process's
user + system CPU time (the development machine's 2 cores are shared, so wall time varies more).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from _results import write_results

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL_8X7B = dict(LAYERS=32, DIM=4096, HEADS=32, FFN=14336, EXPERTS=8, TOP_K=2, VOCAB=32000, SEQ=4096)
LATE_BRANCH = f"""
import sys
sys.path.insert(0, {str(ROOT / "examples")!r})
import torch
from _gpt_common import GPT, GPTConfig, token_batch

CONFIG = GPTConfig(n_layer=96, n_head=96, n_embd=12288, vocab_size=51200, block_size=2048)


class LateBranch(GPT):
    def forward(self, idx):
        logits = super().forward(idx)
        if (idx != 0).nonzero().numel() == 0:
            return logits * 0
        return logits


def build_model():
    return LateBranch(CONFIG)


def example_inputs(batch_size):
    return (token_batch(CONFIG, batch_size),)
"""


def _trace(model: Path, batch: int, env: dict[str, str], out: Path) -> dict:
    """One `autoplan trace` process: exit code, wall and CPU seconds, its last line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    args = [sys.executable, "-m", "autoplan.cli", "trace", str(model), "--batch", str(batch), "--out", str(out)]
    args.append("--json")
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env})
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode == 0:
        summary = json.loads(done.stdout)
        says = f"traced: {summary['nodes']} nodes, {len(summary.get('moe_layers', []))} MoE layers"
    else:
        says = done.stderr.strip().splitlines()[-1][:200]
    return {"exit_code": done.returncode, "wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2), "says": says}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        late = Path(tmp) / "gpt3_late_branch.py"
        late.write_text(LATE_BRANCH)
        cases = {
            "loop_mixtral_8x7b": (ROOT / "tests/odd_models/loop_moe.py", 8,
                                  {f"AUTOPLAN_LOOP_MOE_{k}": str(v) for k, v in MIXTRAL_8X7B.items()}),
            "gpt3_late_branch": (late, 8, {}),
        }  # fmt: skip
        rows = [
            {"model": name, "run": run, **_trace(path, batch, env, Path(tmp) / f"{name}-{run}")}
            for run in range(args.repeat)
            for name, (path, batch, env) in cases.items()
        ]
    table = pd.DataFrame(rows)
    print(table.drop(columns="says").to_string(index=False))
    write_results(table, "moe_loop_trace")


if __name__ == "__main__":
    main()
