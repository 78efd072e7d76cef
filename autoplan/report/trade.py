"""The precision and gradient-sync trade of a chosen plan: what each option would change.

For the chosen plan, CostModel re-prices the same plan with each choice the device and the
plan's shape allow, one at a time (docs/cost-model.md prices them):

- gradient reduction in fp32 (exact) and in 16 bits (bf16 where the device has a bf16 peak,
  else fp16): half the bytes, a rounded sum;
- PowerSGD at ranks 1, 2, 4 and 8 (and the plan's), where the executor runs DDP (ZeRO 0,
  tp = pp = ep = 1): the uncompressed tensors plus the P and Q factors on the wire, the hook's
  matmuls and error feedback added to the step, error-feedback memory held;
- local SGD and DiLoCo at the search's settings (solve/local_sgd.py), where the executor runs the outer sync:
  gradient bytes are then the outer all-reduce's amortised over its H steps (cost/dp/local_sgd.py);
- top-k at DGC's ratios 0.1% and 1% (and the plan's), where PowerSGD runs: every rank's (index, value)
  pairs all-gathered, the selection's passes added, an fp32 residual held (cost/dp/topk.py);
- the matmul precision: bf16 beside fp8 where the device has an fp8 peak.

Each row gives the step time and its ratio to the chosen plan's, the gradient bytes one rank
sends per step, the compression compute, the peak memory, whether it is lossy (``Plan.lossy``)
and whether the search was allowed to pick it, or the flag it needs (``--allow-lossy``, and
``--allow-fp8`` for fp8: solve/space.py). Nothing here is fitted: it is the cost model, asked again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from autoplan.cost import PRECISION_BYTES, CostModel, compresses_any
from autoplan.display import number_text
from autoplan.errors import PlanError
from autoplan.solve.local_sgd import CANDIDATES
from autoplan.types.grad_compression import TOPK_RATIOS
from autoplan.types.local_sgd import is_local_sgd, outer_sync_refusal, synchronous_fields
from autoplan.types.plan import Plan

POWERSGD_RANKS = (1, 2, 4, 8)


@dataclass
class TradeRow:
    option: str
    step_time_s: float
    vs_chosen: float  # step time / the chosen plan's
    grad_bytes_sent: float  # gradient bytes one rank sends per step
    compression_s: float
    peak_memory_bytes: int
    feasible: bool
    lossy: bool
    allowed: bool
    chosen: bool
    needs: str = ""  # the flag that would let the search pick it, when not allowed

    def to_dict(self) -> dict:
        return asdict(self)


def trade_rows(model: CostModel, plan: Plan, *, allowed: set[str]) -> list[TradeRow]:
    """The chosen plan re-priced with each option (module docstring), the chosen one first.
    ``allowed``: what the search could pick beyond exact, non-FP8 options ("lossy", "fp8")."""
    rows = []
    for label, variant in _variants(plan, model):
        try:
            cost = model.estimate(variant)
        except PlanError:
            continue  # this option cannot price on this profile
        needs = _needs(variant, allowed)
        rows.append(
            TradeRow(
                option=label,
                step_time_s=cost.step_time_s,
                vs_chosen=1.0,
                grad_bytes_sent=_grad_bytes(model, variant),
                compression_s=cost.compression_s,
                peak_memory_bytes=cost.peak_memory_bytes,
                feasible=cost.feasible,
                lossy=bool(variant.lossy),
                allowed=not needs,
                chosen=_same_choice(variant, plan),
                needs=" and ".join(needs),
            )
        )
    chosen_s = next((row.step_time_s for row in rows if row.chosen), 0.0)
    for row in rows:
        row.vs_chosen = row.step_time_s / chosen_s if chosen_s else 1.0
    return rows


def _needs(variant: Plan, allowed: set[str]) -> list[str]:
    """The flags the search would need to pick ``variant``."""
    flags = [("lossy", bool(variant.lossy), "--allow-lossy"), ("fp8", variant.precision == "fp8", "--allow-fp8")]
    return [flag for name, uses, flag in flags if uses and name not in allowed]


def _variants(plan: Plan, model: CostModel) -> list[tuple[str, Plan]]:
    """Each option once (by what it changes), the chosen plan first."""
    exact = _with(
        plan, grad_reduce_dtype="fp32", grad_compression="none", powersgd_rank=0, topk_ratio=0.0, **synchronous_fields()
    )
    peaks = model.profile.device.peak_flops
    variants = [plan]
    if plan.precision in ("bf16", "fp8"):
        variants += [_with(exact, precision=p) for p in ("bf16", "fp8") if p in peaks]
    if plan.dp > 1:
        low = "bf16" if "bf16" in peaks else "fp16"
        variants += [exact, _with(exact, grad_reduce_dtype=low)]
        variants += _powersgd_variants(plan, exact, model)
        variants += [_with(exact, sync_every=h, outer_optimizer=name) for h, name in CANDIDATES if runs_outer(exact)]
        variants += _topk_variants(plan, exact)
    unique: dict[tuple, tuple[str, Plan]] = {}
    for variant in variants:
        unique.setdefault(_choice(variant), (label_of(variant), variant))
    return list(unique.values())


def label_of(plan: Plan) -> str:
    """``bf16, reduce fp32`` / ``fp32, PowerSGD rank 4``: the choices a trade row varies."""
    if plan.grad_compression == "powersgd":
        return f"{plan.precision}, PowerSGD rank {plan.powersgd_rank}"
    if is_local_sgd(plan):
        name = "DiLoCo" if plan.outer_optimizer == "nesterov" else "local SGD"
        return f"{plan.precision}, reduce {plan.grad_reduce_dtype}, {name} every {plan.sync_every} steps"
    if plan.grad_compression == "topk":
        return f"{plan.precision}, top-k {plan.topk_ratio:.3g}"
    return f"{plan.precision}, reduce {plan.grad_reduce_dtype}" if plan.dp > 1 else plan.precision


def _powersgd_variants(plan: Plan, exact: Plan, model: CostModel) -> list[Plan]:
    """PowerSGD at the usual ranks, where the executor runs DDP and the rank compresses something."""
    if not (plan.runs_ddp and plan.ep == 1):
        return []
    return [
        _with(exact, grad_compression="powersgd", powersgd_rank=rank)
        for rank in sorted({*POWERSGD_RANKS, plan.powersgd_rank} - {0})
        if compresses_any(model.graph, rank)
    ]


def runs_outer(plan: Plan) -> bool:
    """Whether the executor runs an outer sync on this plan's layout (types/local_sgd.py)."""
    return not outer_sync_refusal(plan)


def _topk_variants(plan: Plan, exact: Plan) -> list[Plan]:
    """Top-k at the search's ratios (and the plan's), where the executor runs DDP."""
    if not (plan.runs_ddp and plan.ep == 1):
        return []
    ratios = sorted({*TOPK_RATIOS, plan.topk_ratio} - {0.0})
    return [_with(exact, grad_compression="topk", topk_ratio=ratio) for ratio in ratios]


def _choice(plan: Plan) -> tuple:
    return (
        plan.precision, plan.grad_reduce_dtype, plan.grad_compression, plan.powersgd_rank, plan.topk_ratio,
        plan.sync_every, plan.outer_optimizer,
    )  # fmt: skip


def _same_choice(a: Plan, b: Plan) -> bool:
    return _choice(a) == _choice(b)


def _with(plan: Plan, **changes) -> Plan:
    changed = replace(plan, tp_plan={}, predicted=None, **changes)
    changed.tp_plan = plan.tp_plan
    return changed


def _grad_bytes(model: CostModel, plan: Plan) -> float:
    """Gradient bytes one rank sends per step over dp (the message, not the ring's bus traffic)."""
    if plan.dp == 1:
        return 0.0
    stages, _, _ = model.priced_stages(plan)
    if plan.grad_compression != "none":  # PowerSGD's factors, top-k's all-gathered pairs
        return max(model.powersgd_stage(plan, s).sent_bytes for s in stages)
    outer = model.estimate(plan).extra.get("outer_sync_bytes", 0.0) / plan.sync_every  # local SGD's, amortised
    inner = plan.sync_every == 1 or plan.dp_replicate > 1  # gradients synced every step (within a replica)
    return outer + inner * max(s.trainable_params for s in stages) * PRECISION_BYTES[plan.grad_reduce_dtype]


def trade_lines(rows: list[dict]) -> list[str]:
    """A Markdown table of the rows (dicts of TradeRow)."""
    if not rows:
        return ["No precision or gradient-sync option applies to this plan."]
    lines = [
        "| option | step ms | vs chosen | grad MB sent | compress ms | peak GiB | lossy | allowed |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        mark = " (chosen)" if r["chosen"] else ""
        fits = "" if r["feasible"] else " (does not fit)"
        lines.append(
            f"| {r['option']}{mark} | {number_text(1e3 * r['step_time_s'])} | {r['vs_chosen']:.2f}x | "
            f"{number_text(r['grad_bytes_sent'] / 1e6)} | {number_text(1e3 * r['compression_s'])} | "
            f"{r['peak_memory_bytes'] / 2**30:.2f}{fits} | {'yes' if r['lossy'] else 'no'} | "
            f"{'yes' if r['allowed'] else 'needs ' + (r.get('needs') or '--allow-lossy')} |"
        )
    return lines
