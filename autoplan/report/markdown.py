"""``report.md``: one page that puts the tables, the figures and the explanation together.

Sections: what was planned (model and cluster), the chosen plan and its prediction, the
top plans side by side, the pipeline timeline and memory, predicted against measured (when
run folders were given) and the explanation (autoplan/report/narrate.py).
"""

from __future__ import annotations

import pandas as pd

from autoplan.display import TERM_NAMES, duration_unit, number_text
from autoplan.report.folder import PlanFolder, most_frugal
from autoplan.report.tables import audit_summary, describe_row, top_feasible
from autoplan.types.cost import Cost

GIB = 2**30
#: the columns of the stage and run tables report.md and report.html show (all are in the CSVs)
STAGE_COLUMNS = ["stage", "blocks", "first_block", "last_block", "forward_s", "backward_s", "send_recv_s", "memory_gib"]
RUN_COLUMNS = [
    "run",
    "plan",
    "steps",
    "predicted_step_time_s",
    "measured_step_time_s",
    "measured_over_predicted",
    "error_pct",
    "measured_peak_memory_bytes",
    "peak_memory_kind",
]
AUDIT_COLUMNS = ["run", "quantity", "rows", "as_priced", "max_abs_error"]


def _ms(value) -> str:
    return number_text(float(value) * 1e3)


def model_lines(folder: PlanFolder) -> list[str]:
    g, p = folder.graph, folder.profile
    lines = []
    if g is not None:
        seq = f", sequence {g.seq_len}" if g.seq_len else ""
        lines.append(
            f"- **Model:** {g.model_name}: {g.param_count / 1e6:.2f} M parameters, {len(g.layers)} blocks, "
            f"{g.step_flops / g.batch_size / 1e9:.3g} GFLOP per sample per step{seq}."
        )
    if p is not None:
        inter = p.inter_node.collectives["all_reduce"].busbw_bytes_per_s / 1e9 if p.inter_node else None
        lines.append(
            f"- **Cluster:** profile `{p.name}`: {p.device.name}, {p.device.memory_bytes / GIB:.1f} GiB, "
            f"{p.devices_per_node} per node, "
            f"intra-node all-reduce {p.intra_node.collectives['all_reduce'].busbw_bytes_per_s / 1e9:.3g} GB/s"
            + (f", inter-node {inter:.3g} GB/s." if inter else ", no inter-node link.")
        )
    return lines


def plan_lines(folder: PlanFolder) -> list[str]:
    plan = folder.plan
    if plan is None:
        return ["**No plan fits:** " + most_frugal(folder.plans)]
    pred = plan.predicted
    head = f"**Chosen plan:** `{plan.describe()}` on {plan.devices} devices, global batch {plan.global_batch_size}."
    if pred is None:
        return [head, "", "The plan carries no prediction."]
    tokens = f", {pred.tokens_per_s:.4g} tokens/s" if pred.tokens_per_s else ""
    lines = [
        head,
        "",
        f"Predicted: {_ms(pred.step_time_s)} ms per step, {pred.samples_per_s:.4g} samples/s{tokens}, "
        f"MFU {100 * pred.mfu:.1f}%, peak {pred.peak_memory_bytes / GIB:.2f} GiB per device.",
    ]
    if (search := pred.search) is not None:
        lines[-1] += (
            f" The search priced {search.candidates_evaluated} plans and pruned {search.candidates_pruned} "
            f"in {search.search_time_s:.2f} s{_on(search.search_processes)} (tp ILP: {search.ilp_status}, "
            f"gap {search.ilp_gap:.2g})."
        )
    return lines


def top_table(plans: pd.DataFrame, top_k: int) -> list[str]:
    """The top plans and their step-time terms (autoplan/display.py names), in the best step's unit."""
    top = top_feasible(plans, top_k)
    scale, unit = duration_unit(float(top["step_time_s"].iloc[0]) if len(top) else 1.0)
    lines = [
        f"| # | plan | step {unit} | " + " | ".join(TERM_NAMES[t].header for t in Cost.TIME_FIELDS) + " | peak GiB |",
        "|---|---|---:|" + "---:|" * len(Cost.TIME_FIELDS) + "---:|",
    ]
    for rank, (_, row) in enumerate(top.iterrows(), start=1):
        cells = " | ".join(number_text(float(row[t]) / scale) for t in Cost.TIME_FIELDS)
        lines.append(
            f"| {rank} | {describe_row(row)} | {number_text(float(row['step_time_s']) / scale)} | {cells} | "
            f"{float(row['peak_memory_bytes']) / GIB:.2f} |"
        )
    return lines


def frame_table(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    columns = [c for c in columns if c in frame]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in frame.iterrows():
        lines.append(
            "| " + " | ".join(f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in columns) + " |"
        )
    return lines


def report_markdown(
    folder: PlanFolder,
    *,
    tables: dict[str, pd.DataFrame],
    figures: dict[str, str],
    explanation_md: str | None,
    top_k: int,
) -> str:
    lines = [f"# autoplan report: {folder.path.name}", "", "## What was planned", ""] + model_lines(folder) + [""]
    lines += plan_lines(folder) + [""]
    if len(top_feasible(tables["plans"], top_k)):
        lines += [f"## The top {top_k} plans (step time and its terms)", ""] + top_table(tables["plans"], top_k) + [""]
    for name, caption in (
        ("breakdown.png", "Step-time breakdown"),
        ("timeline.png", "Pipeline timeline of one step"),
        ("memory.png", "Memory per device"),
    ):
        if name in figures:
            lines += [f"![{caption}]({figures[name]})", ""]
    if tables.get("stages") is not None:
        lines += ["## Stages", ""] + frame_table(tables["stages"], STAGE_COLUMNS) + [""]
    if tables.get("runs") is not None:
        lines += ["## Predicted against measured", ""] + frame_table(tables["runs"], RUN_COLUMNS) + [""]
        if "predicted_vs_measured.png" in figures:
            lines += [f"![Predicted against measured]({figures['predicted_vs_measured.png']})", ""]
    if tables.get("audit") is not None:
        lines += [
            "## Execution audit",
            "",
            "One step per audited run, per rank: collectives (count and bytes), parameters held, "
            "matmul and attention FLOPs and peak live memory against the cost model (audit.csv has every row).",
            "",
        ]
        lines += frame_table(audit_summary(tables["audit"]), AUDIT_COLUMNS) + [""]
    if explanation_md:
        lines += [
            explanation_md.replace("## ", "### ").replace("### Why this plan", "## Explanation\n\n### Why this plan", 1)
        ]
    return "\n".join(lines) + "\n"


def _on(processes: int) -> str:
    """Where the search ran on several processes (solve/shares.py), on how many."""
    return f" on {processes} processes" if processes > 1 else ""
