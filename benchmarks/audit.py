"""The execution audit on the shipped examples, through the user's path: `autoplan run --audit`.

For each plan family the script writes a plan for one of the shipped examples at a small size,
runs it for two steps with ``--audit`` on this machine's CPU ranks (2, or 4 for products of two
parallel axes), and tabulates the run's audit.csv: how many collective rows are as priced (count
and bytes), the largest FLOP error, the peak live memory against the prediction, and how many
in-place reshards (an all-gather no plan prices) the step ran. The families:

- data parallel with each ZeRO stage, fp32 and bf16 compute, 16-bit gradient reduction, PowerSGD;
- tensor parallel with and without sequence parallelism, fp32 and bf16; pipelines under each
  schedule; each recomputation mode;
- the products: dp x tp (ZeRO-1), dp x pp (ZeRO-2), tp x pp (with and without SP);
- Mixture-of-Experts (examples/moe.py, examples/hf_mixtral.py): expert parallelism (DDP, ZeRO-1,
  under a pipeline), tensor parallelism with and without SP, selective recomputation of grouped
  expert GEMMs;
- FP8, emulated on the CPU (``AUTOPLAN_FP8_EMULATE=1``, autoplan/execute/float8.py), priced on a
  profile with an FP8 peak (dgx-h100): dp, tp with SP, selective recomputation. Collectives and
  FLOPs do not depend on the device; the memory column prices GPU kernels' saved tensors beside
  a CPU run's, so it is not comparable for these rows.

    python benchmarks/audit.py [--only NAME] [--out benchmarks/results/audit.csv]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

import pandas as pd
from _results import write_results

from autoplan.cli.rank import write_audit_prediction
from autoplan.cost.tp.default import default_tp_plan
from autoplan.errors import RunError
from autoplan.jobs.launcher import launch
from autoplan.profile import load_profile, save_profile
from autoplan.trace import trace_model_file
from autoplan.types import Plan
from autoplan.types.moe import RoutingModel
from autoplan.types.run_options import RunOptions

ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "AUTOPLAN_GPT_N_LAYER": "4",
    "AUTOPLAN_GPT_N_EMBD": "128",
    "AUTOPLAN_GPT_N_HEAD": "4",
    "AUTOPLAN_GPT_BLOCK_SIZE": "64",
    "AUTOPLAN_GPT_VOCAB_SIZE": "1024",
    "AUTOPLAN_LLAMA_N_LAYERS": "4",
    "AUTOPLAN_LLAMA_DIM": "128",
    "AUTOPLAN_LLAMA_FFN_DIM": "352",
    "AUTOPLAN_LLAMA_N_HEADS": "4",
    "AUTOPLAN_LLAMA_N_KV_HEADS": "2",
    "AUTOPLAN_LLAMA_SEQ_LEN": "64",
    "AUTOPLAN_LLAMA_VOCAB_SIZE": "1024",
    "AUTOPLAN_MOE_LAYERS": "2",
    "AUTOPLAN_MOE_DIM": "64",
    "AUTOPLAN_MOE_HEADS": "4",
    "AUTOPLAN_MOE_EXPERTS": "4",
    "AUTOPLAN_MOE_VOCAB": "512",
    "AUTOPLAN_MOE_SEQ": "32",
    "AUTOPLAN_HF_MIXTRAL_LAYERS": "2",
    "AUTOPLAN_HF_MIXTRAL_DIM": "64",
    "AUTOPLAN_HF_MIXTRAL_HEADS": "4",
    "AUTOPLAN_HF_MIXTRAL_FFN": "128",
    "AUTOPLAN_HF_MIXTRAL_EXPERTS": "4",
    "AUTOPLAN_HF_MIXTRAL_VOCAB": "512",
    "AUTOPLAN_HF_MIXTRAL_SEQ": "32",
}
FP8 = dict(precision="fp8", profile="dgx-h100")  # emulated on the CPU (module docstring)
FAMILIES = [
    ("ddp", "gpt", dict(dp=2)),
    ("ddp_bf16", "gpt", dict(dp=2, precision="bf16")),
    ("zero1", "gpt", dict(dp=2, zero_stage=1)),
    ("zero1_bf16_reduce", "gpt", dict(dp=2, zero_stage=1, grad_reduce_dtype="bf16")),
    ("zero2", "gpt", dict(dp=2, zero_stage=2)),
    ("zero3", "llama", dict(dp=2, zero_stage=3)),
    ("zero3_bf16", "llama", dict(dp=2, zero_stage=3, precision="bf16")),
    ("ddp_bf16_reduce", "gpt", dict(dp=2, grad_reduce_dtype="bf16")),
    ("ddp_powersgd", "gpt", dict(dp=2, grad_compression="powersgd", powersgd_rank=4)),
    ("ddp_recompute_full", "gpt", dict(dp=2, recompute="full")),
    ("ddp_recompute_selective", "llama", dict(dp=2, recompute="selective")),
    ("tp", "gpt", dict(tp=2)),
    ("tp_bf16", "llama", dict(tp=2, precision="bf16")),
    ("tp_sp", "llama", dict(tp=2, sequence_parallel=True)),
    ("pp_gpipe", "gpt", dict(pp=2, schedule="gpipe")),
    ("pp_1f1b", "llama", dict(pp=2, schedule="1f1b", num_microbatches=4)),
    ("pp_interleaved", "gpt", dict(pp=2, schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4)),
    ("dp_tp_zero1", "llama", dict(dp=2, tp=2, zero_stage=1)),
    ("dp_pp_zero2", "gpt", dict(dp=2, pp=2, zero_stage=2)),
    ("tp_pp", "llama", dict(tp=2, pp=2)),
    ("tp_sp_pp_1f1b", "gpt", dict(tp=2, pp=2, sequence_parallel=True, schedule="1f1b", num_microbatches=4)),
    ("moe_ep", "moe", dict(dp=2, ep=2)),
    ("moe_ep_zero1", "moe", dict(dp=2, ep=2, zero_stage=1)),
    ("moe_ep_pp", "moe", dict(dp=2, ep=2, pp=2)),
    ("moe_tp", "moe", dict(tp=2)),
    ("moe_tp_sp", "moe", dict(tp=2, sequence_parallel=True)),
    ("mixtral_selective", "hf_mixtral", dict(dp=2, recompute="selective")),
    ("mixtral_tp_sp_selective", "hf_mixtral", dict(tp=2, sequence_parallel=True, recompute="selective")),
    ("fp8_dp", "gpt", dict(dp=2, **FP8)),
    ("fp8_tp_sp", "llama", dict(tp=2, sequence_parallel=True, **FP8)),
    ("fp8_selective", "gpt", dict(dp=2, recompute="selective", **FP8)),
]


def plan_for(model: str, **kw) -> Plan:
    """The family's plan: balanced stages, the default (Megatron) TP split, the balanced routing
    model for an MoE example."""
    graph = trace_model_file(ROOT / "examples" / f"{model}.py", 2)
    kw.setdefault("num_microbatches", 2)
    kw.setdefault("profile", "cpu-gloo")
    for axis in ("dp", "tp", "pp"):
        kw.setdefault(axis, 1)
    chunks = kw["pp"] * kw.get("virtual_stages", 1)
    per = len(graph.layers) // chunks
    stages = [graph.layers[i * per : (i + 1) * per] for i in range(chunks)]
    tp_plan = default_tp_plan(graph, kw["tp"], sequence_parallel=kw.get("sequence_parallel", False))
    routing = RoutingModel() if graph.moe_layers else None
    return Plan(
        devices=kw["dp"] * kw["tp"] * kw["pp"],
        micro_batch_size=2,
        stages=stages,
        tp_plan=tp_plan,
        model=model,
        routing=routing,
        **kw,
    )


def node_profile(devices: int, folder: Path) -> str:
    """cpu-gloo, or, for more ranks than its one node holds, a copy of it whose node holds them
    all, saved in ``folder`` (the volumes the audit checks do not depend on the link)."""
    profile = load_profile("cpu-gloo")
    if devices <= profile.devices_per_node:
        return "cpu-gloo"
    wide = dataclasses.replace(profile, devices_per_node=devices)
    return str(save_profile(wide, folder / f"cpu-gloo-{devices}.yaml"))


def audit_family(name: str, model: str, kw: dict, folder: Path) -> dict:
    if "profile" not in kw:
        kw["profile"] = node_profile(kw.get("dp", 1) * kw.get("tp", 1) * kw.get("pp", 1), folder)
    plan = plan_for(model, **kw)
    plan_path = plan.save(folder / f"{name}.json")
    out = folder / name
    os.environ["AUTOPLAN_FP8_EMULATE"] = "1" if plan.precision == "fp8" else ""  # the ranks inherit it
    try:
        opts = RunOptions(
            model=str(ROOT / "examples" / f"{model}.py"), plan=str(plan_path), out=str(out), steps=2, audit=True,
            timeout_s=300,
        )  # fmt: skip
        write_audit_prediction(opts, plan)  # as `autoplan run --audit` does before its ranks start
        code = launch(args=[opts.to_json()], nprocs=plan.devices, module="autoplan.cli.rank")
    except RunError as exc:  # a rank died: say so in the table and go on with the other families
        return {"family": name, "plan": plan.describe(), "exit": "failed", "error": str(exc)}
    audit = pd.read_csv(out / "audit.csv")
    comm = audit[audit.what.str.startswith("comm")]
    flops = audit[audit.what.str.contains("matmul FLOPs")]
    memory = audit[audit.what == "peak live memory"]
    reshards = audit[audit.what == "in-place reshards"]
    return {
        "family": name,
        "plan": plan.describe(),
        "exit": code,
        "collective_rows": len(comm),
        "as_priced": int(comm.as_priced.sum()),
        "max_comm_error_pct": round(100 * comm.relative_error.abs().max(), 2),
        "max_matmul_flops_error_pct": round(100 * flops.relative_error.abs().max(), 2),
        "peak_memory_error_pct": round(100 * memory.relative_error.abs().max(), 1),
        "in_place_reshards": int(reshards.measured.max()) if len(reshards) else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only families whose name contains one of these (a,b,...)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--runs", default=None, help="keep each family's plan and run folder (with audit.csv) here")
    args = parser.parse_args()
    os.environ.update(SIZES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoplan-audit-") as tmp:
        folder = Path(args.runs or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name, model, kw in FAMILIES:
            if any(part in name for part in args.only.split(",")):
                rows.append(audit_family(name, model, dict(kw), folder))
                print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    write_results(rows, "audit", path=args.out)


if __name__ == "__main__":
    main()
