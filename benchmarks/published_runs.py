"""Predict published Megatron-LM runs (GPT 1.7B .. 1T on 8 .. 3072 A100s, 1.7B .. 462B on 48 .. 6144
H100s) with the shipped profiles.

For each row of benchmarks/published_runs.csv (numbers and sources in the file): build the
GPT shape on the meta device, trace it with autoplan's tracer (in the row's precision, one
sequence), set the published plan with ``Plan(...)`` and predict the step time with the row's
profile (profiles/dgx-a100.yaml for the papers, dgx-h100.yaml for Megatron-Core's table). No
per-run factor is fitted: the same profile and cost model price every run. Each row's plan
carries how that software ran, as a user would set it: ``overlap_grad_reduce=false`` (the
data-parallel all-reduce after the backward, Megatron-LM before 2023), ``grad_reduce_dtype``
(fp16 runs reduced fp16 gradients: Megatron-LM forces fp32 only for bf16, arguments.py) and
the micro-batch size (1 where the paper does not give it; the CSV's notes say so), and the
``runtime`` column, the software that ran it (docs/cost-model.md, "Runtimes"): the Megatron-LM of
those papers (``megatron-lm-2022``: no flash attention, fused softmax and bias-GeLU kernels; its
gradient-accumulation fusion needed fp32 accumulation, which these fp16 runs did not use, so each
micro-batch adds its fp16 gradients in a pass of their own), and DeepSpeed for Table 2's ZeRO-3 rows.

The GPT is Megatron-LM's as those papers ran it (examples/gpt_megatron.py): pre-LayerNorm
blocks, one fused head-interleaved QKV linear, attention that materialises the b*a*s*s
scores (QK^T, causal mask, softmax, dropout 0.1, probs @ V; no flash attention in 2021-22),
GELU MLP of 4h, hidden dropout 0.1, and an output head tied to the word embedding.
Published step time for Narayanan et al. Table 1 rows comes from their eq. (3) FLOPs and
the achieved TFLOP/s per GPU; Korthikanti et al. report iteration times directly. The
``narayanan-t2-*`` rows are their Table 2: GPT-175B at a fixed global batch of 1,536 under
ZeRO-3 without model parallelism (DeepSpeed, 2021) and under PTD-P, on 384, 768 and 1,536
GPUs: a check of how the two are ranked (``zero_stage`` column; docs/cost-model.md
discusses the ZeRO-3 rows).

The ``mcore-h100-*`` rows are the model table of Megatron-LM's README (Megatron-Core on H100s,
2024): tp, pp, dp, global batch and TFLOP/s per GPU as published, run with ``--overlap-grad-reduce
--overlap-param-gather --tp-comm-overlap`` (the README); what the table leaves out is assumed and
named in the CSV's notes.

    python benchmarks/published_runs.py [--profile dgx-a100] [--only korthikanti]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
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
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def _megatron_example():
    """examples/gpt_megatron.py, loaded by path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpt_megatron", HERE.parent / "examples" / "gpt_megatron.py")
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def trace_gpt(row: pd.Series):
    example = _megatron_example()
    config = example.MegatronGPTConfig(
        n_layer=int(row.layers),
        n_embd=int(row.hidden),
        n_head=int(row.heads),
        seq_len=int(row.seq_len),
        vocab_size=int(row.vocab),
    )
    with torch.device("meta"):
        model = example.MegatronGPT(config).to(getattr(torch, DTYPES[str(row.precision)]))
    idx = torch.zeros(1, int(row.seq_len), dtype=torch.long, device="meta")
    return trace(model, (idx,), loss_fn=_loss, target=idx, model_name=str(row.run))


def published_step_s(row: pd.Series) -> float:
    """Iteration time: reported (Korthikanti), or the FLOPs the source counts (its ``flops_formula``)
    over its achieved FLOP/s: Narayanan's eq. (3), with recomputation; Megatron-Core's
    ``num_floating_point_operations`` (megatron/training/training.py), for MHA, an MLP of 4h and no
    SwiGLU 12 B s L h^2 (2 + s/h + 4 + V / (2 L h)), without recomputation."""
    if not pd.isna(row.published_step_s):
        return float(row.published_step_s)
    b, s, l, h, v = row.global_batch, row.seq_len, row.layers, row.hidden, row.vocab
    if row.flops_formula == "megatron-core":
        flops = 12 * b * s * l * h**2 * (2 + s / h + 4 + v / (2 * l * h))
    else:
        flops = 96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
    return flops / (row.published_tflops_per_gpu * 1e12 * row.devices)


def plan_for(row: pd.Series, *, runtime: str = "") -> Plan:
    """The row's published plan, priced for the runtime that ran it, or for ``runtime`` when given."""
    micro = int(row.micro_batch)
    return Plan(
        devices=int(row.devices),
        dp=int(row.dp),
        tp=int(row.tp),
        pp=int(row.pp),
        micro_batch_size=micro,
        num_microbatches=int(row.global_batch) // (int(row.dp) * micro),
        schedule=str(row.schedule),
        virtual_stages=int(row.virtual_stages),
        zero_stage=int(row.zero_stage),
        recompute=str(row.recompute),
        sequence_parallel=str(row.sequence_parallel).lower() == "true",
        precision=str(row.precision),
        overlap_grad_reduce=str(row.overlap_grad_reduce).lower() == "true",
        grad_reduce_dtype=str(row.grad_reduce_dtype),
        runtime=runtime or str(row.runtime),
        tp_comm_overlap=str(row.tp_comm_overlap).lower() == "true",
        overlap_param_gather=str(row.overlap_param_gather).lower() == "true",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="", help="price every row on this profile (default: each row's own)")
    parser.add_argument("--only", default="", help="run only rows whose name contains this")
    parser.add_argument(
        "--runtime", default="", help="price every row for this runtime (e.g. autoplan: as autoplan's executor runs it)"
    )
    parser.add_argument("--out", default=str(HERE / "results" / "published_runs.csv"))
    args = parser.parse_args()
    profiles = {}  # by name: each row's own profile, or --profile for all
    runs = pd.read_csv(HERE / "published_runs.csv")
    runs["flops_formula"] = runs["flops_formula"].fillna("")
    rows = []
    for _, row in runs[runs.run.str.contains(args.only)].iterrows():
        start = time.perf_counter()
        graph = trace_gpt(row)
        name = args.profile or str(row.profile)
        profile = profiles.setdefault(name, load_profile(name))
        cost = CostModel(graph, profile).estimate(plan_for(row, runtime=args.runtime))
        published = published_step_s(row)
        rows.append(
            dict(
                run=row.run,
                devices=row.devices,
                published_step_s=round(published, 3),
                predicted_step_s=round(cost.step_time_s, 3),
                error_pct=round(100 * (cost.step_time_s / published - 1), 1),
                runtime=args.runtime or row.runtime,
                compute_s=round(cost.compute_s, 3),
                recompute_s=round(cost.recompute_s, 3),
                tp_s=round(cost.tp_comm_s, 3),
                bubble_s=round(cost.bubble_s, 3),
                pp_s=round(cost.pp_comm_s, 3),
                dp_exposed_s=round(cost.dp_comm_exposed_s, 3),
                grad_accum_s=round(cost.grad_accum_s, 3),
                optimizer_s=round(cost.optimizer_s, 3),
                mfu=round(cost.mfu, 3),
                peak_gib=round(cost.peak_memory_bytes / 2**30, 1),
                feasible=cost.feasible,
                trace_s=round(time.perf_counter() - start, 1),
            )
        )
        print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    table = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    table["source"] = list(runs[runs.run.str.contains(args.only)].source)
    for source, part in table.groupby("source", sort=False):
        print(
            f"{source}: mean |error| {part.error_pct.abs().mean():.1f}%, max |error| {part.error_pct.abs().max():.1f}%"
        )
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
