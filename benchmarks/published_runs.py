"""Predict published Megatron-LM runs (GPT 1.7B .. 1T on 8 .. 3072 A100s) with the shipped profile.

For each row of benchmarks/published_runs.csv (numbers and sources in the file): build the
GPT shape on the meta device, trace it with autoplan's tracer (fp16, one sequence), set the
published plan with ``Plan(...)`` and predict the step time with profiles/dgx-a100.yaml. No
per-run factor is fitted: the same profile and cost model price every run.

The GPT is Megatron's: pre-LayerNorm blocks, separate q/k/v projections (Megatron shards its
fused QKV weight by heads, which is the same as sharding separate projections colwise), fused
attention, GELU MLP of 4h, and a vocabulary head. Published step time for Narayanan et al.
Table 1 rows comes from their eq. (3) FLOPs and the achieved TFLOP/s per GPU; Korthikanti et
al. report iteration times directly.

    python benchmarks/published_runs.py [--profile profiles/dgx-a100.yaml] [--only korthikanti]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from autoplan.cost import CostModel
from autoplan.profile import load_profile
from autoplan.trace import trace
from autoplan.types import Plan

HERE = Path(__file__).parent


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (f(x).view(b, s, self.heads, h // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.out(nn.functional.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, *, layers: int, hidden: int, heads: int, seq_len: int, vocab: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(seq_len, hidden)
        self.h = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def trace_gpt(row: pd.Series):
    with torch.device("meta"):
        model = GPT(layers=int(row.layers), hidden=int(row.hidden), heads=int(row.heads),
                    seq_len=int(row.seq_len), vocab=int(row.vocab)).to(torch.float16)
    idx = torch.zeros(1, int(row.seq_len), dtype=torch.long, device="meta")
    return trace(model, (idx,), loss_fn=_loss, target=idx, model_name=str(row.run))


def published_step_s(row: pd.Series) -> float:
    """Iteration time: reported (Korthikanti) or from eq. (3) FLOPs / achieved FLOP/s (Narayanan)."""
    if not pd.isna(row.published_step_s):
        return float(row.published_step_s)
    b, s, l, h, v = row.global_batch, row.seq_len, row.layers, row.hidden, row.vocab
    flops = 96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
    return flops / (row.published_tflops_per_gpu * 1e12 * row.devices)


def plan_for(row: pd.Series) -> Plan:
    micro = int(row.micro_batch)
    return Plan(devices=int(row.devices), dp=int(row.dp), tp=int(row.tp), pp=int(row.pp), micro_batch_size=micro,
                num_microbatches=int(row.global_batch) // (int(row.dp) * micro), schedule=str(row.schedule),
                virtual_stages=int(row.virtual_stages), recompute=str(row.recompute),
                sequence_parallel=str(row.sequence_parallel).lower() == "true", precision=str(row.precision))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=str(HERE.parent / "profiles" / "dgx-a100.yaml"))
    parser.add_argument("--only", default="", help="run only rows whose name contains this")
    parser.add_argument("--out", default=str(HERE / "results" / "published_runs.csv"))
    args = parser.parse_args()
    profile = load_profile(args.profile)
    runs = pd.read_csv(HERE / "published_runs.csv")
    rows = []
    for _, row in runs[runs.run.str.contains(args.only)].iterrows():
        start = time.perf_counter()
        graph = trace_gpt(row)
        cost = CostModel(graph, profile).estimate(plan_for(row))
        published = published_step_s(row)
        rows.append(dict(run=row.run, devices=row.devices, published_step_s=round(published, 3),
                         predicted_step_s=round(cost.step_time_s, 3), error_pct=round(100 * (cost.step_time_s / published - 1), 1),
                         compute_s=round(cost.compute_s, 3), recompute_s=round(cost.recompute_s, 3), tp_s=round(cost.tp_comm_s, 3),
                         bubble_s=round(cost.bubble_s, 3), pp_s=round(cost.pp_comm_s, 3), dp_exposed_s=round(cost.dp_comm_exposed_s, 3),
                         optimizer_s=round(cost.optimizer_s, 3), mfu=round(cost.mfu, 3), peak_gib=round(cost.peak_memory_bytes / 2**30, 1),
                         feasible=cost.feasible, trace_s=round(time.perf_counter() - start, 1)))
        print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    table = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(f"\nmean |error| {table.error_pct.abs().mean():.1f}%, max |error| {table.error_pct.abs().max():.1f}%  -> {args.out}")


if __name__ == "__main__":
    main()
