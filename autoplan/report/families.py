"""Why each other (dp, tp, pp) family lost to the chosen plan (``autoplan explain``, part 3), and
the term-by-term comparison of two priced plans (:class:`Rival`) the verdicts rest on.

A family with a member that fits lost on the deciding term (autoplan/report/terms.py) of its
best fitting member, and its members that would have won but do not fit are named beside it; a
family none of whose members fits lost to memory. A family the search pruned by its lower bound
is priced with the cost model's default layout (balanced stages, Megatron tp plan) to name the
term. The explanation's decision line states the verdict of the nearest other family, so the
two never disagree (autoplan/report/narrate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.cost import CostModel
from autoplan.display import duration_text
from autoplan.errors import AutoplanError
from autoplan.report.terms import TermDiff, category_of, deciding_term, term_diffs
from autoplan.types.plan import Plan

GIB = 2**30


@dataclass
class Rival:
    plan: str
    family: str
    objective: float
    step_time_s: float
    slower_pct: float
    deciding: TermDiff | None
    diffs: list[TermDiff]
    peak_memory_bytes: int
    memory_diff_bytes: int

    @property
    def category(self) -> str:
        return category_of(self.deciding)


@dataclass
class FamilyVerdict:
    family: str
    verdict: str  # chosen | compute | communication | bubble | optimizer | out of memory | tie
    detail: str
    member: str | None = None
    slower_pct: float | None = None
    term: str | None = None


def family_of(config: dict) -> str:
    """``dp=4 tp=2 pp=1``, with ``ep=``, ``etp=`` and ``cp=`` where they are above 1 (the mesh's order)."""
    ep, cp = config.get("ep", 1), config.get("cp", 1)
    ep = f" ep={ep}" if str(ep) not in ("1", "nan", "") else ""
    ep += f" etp={config['expert_tp']}" if str(config.get("expert_tp", 1)) not in ("1", "nan", "") else ""
    cp = f" cp={cp}" if str(cp) not in ("1", "nan", "") else ""
    return f"dp={config['dp']}{ep}{cp} tp={config['tp']} pp={config['pp']}"


def rival_of(best, cand) -> Rival:
    bc, rc = best.cost, cand.cost
    return Rival(
        plan=cand.plan.describe(),
        family=family_of(cand.config),
        objective=cand.objective,
        step_time_s=rc.step_time_s,
        slower_pct=100.0 * (cand.objective / best.objective - 1.0),
        deciding=deciding_term(bc, rc),
        diffs=term_diffs(bc, rc),
        peak_memory_bytes=rc.peak_memory_bytes,
        memory_diff_bytes=rc.peak_memory_bytes - bc.peak_memory_bytes,
    )


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _oom_verdict(family: str, members: list, best, usable: float) -> FamilyVerdict | None:
    """A family none of whose priced members fits: its fastest would-be winner, or its most frugal."""
    priced = [c for c in members if c.cost is not None]
    if not priced or any(c.feasible for c in priced):
        return None
    faster = [c for c in priced if c.objective is not None and c.objective < best.objective]  # None: not timed
    if faster:
        c = min(faster, key=lambda c: c.objective)
        detail = f"none of its members fits; {_would_win(c, best, usable)}"
        return FamilyVerdict(
            family, "out of memory", detail, c.plan.describe(), 100 * (c.objective / best.objective - 1)
        )
    c = min(priced, key=lambda c: c.cost.peak_memory_bytes)
    detail = (
        f"none of its {len(priced)} priced members fits: the most frugal ({c.plan.describe()}) "
        f"needs {_gib(c.cost.peak_memory_bytes)} of {_gib(usable)} usable"
    )
    return FamilyVerdict(family, "out of memory", detail, c.plan.describe())


def _would_win(c, best, usable: float) -> str:
    return (
        f"its fastest ({c.plan.describe()}) would be {100 * (1 - c.objective / best.objective):.1f}% faster than "
        f"the chosen plan but needs {_gib(c.cost.peak_memory_bytes)} per device of {_gib(usable)} usable"
    )


def _fitting_verdict(family: str, members: list, best, usable: float) -> FamilyVerdict:
    """A family with a member that fits lost on the deciding term of that member (the planner's
    own ranking picks it); members that would have won but do not fit are named after it."""
    feasible = [c for c in members if c.feasible]
    verdict = _term_verdict(family, best, min(feasible, key=lambda c: c.objective))
    faster = [
        c
        for c in members
        if c.cost is not None and not c.feasible and c.objective is not None and c.objective < best.objective
    ]
    if faster:
        verdict.detail += "; " + _would_win(min(faster, key=lambda c: c.objective), best, usable)
    return verdict


def _term_verdict(family: str, best, cand, *, prefix: str = "") -> FamilyVerdict:
    rival = rival_of(best, cand)
    d = rival.deciding
    if d is None:
        return FamilyVerdict(
            family,
            "tie",
            f"{prefix}its best member ({rival.plan}) ties with the chosen plan",
            rival.plan,
            rival.slower_pct,
        )
    detail = (
        f"{prefix}its best member ({rival.plan}) is {rival.slower_pct:.1f}% slower, mostly in {d.words} "
        f"({duration_text(d.rival_s)} against {duration_text(d.best_s)})"
    )
    return FamilyVerdict(family, d.category, detail, rival.plan, rival.slower_pct, d.term)


def _pruned_verdict(
    family: str, members: list, best, model: CostModel | None, objective, stand_ins: list
) -> FamilyVerdict:
    bound = min(members, key=lambda c: (c.config.get("precision") != best.config.get("precision"), c.lower_bound))
    head = (
        f"pruned: its lower bound {bound.lower_bound:.4g} is already above the best {best.objective:.4g}"
        if bound.lower_bound >= best.objective
        else bound.reason  # pruned by a rule, not by its bound (degenerate tp, the memory floor)
    )
    plan = _default_layout(bound.config)
    if model is None or plan is None:
        return FamilyVerdict(family, "compute", head + " (compute and optimizer alone, with no communication)")
    try:
        cost = model.estimate(plan)
    except AutoplanError:
        return FamilyVerdict(family, "compute", head)
    if not cost.feasible:
        return FamilyVerdict(
            family,
            "out of memory",
            f"{head}; with a default layout ({plan.describe()}) it also needs "
            f"{_gib(cost.peak_memory_bytes)} per device",
            plan.describe(),
        )
    stand_in = _Priced(config=bound.config, plan=plan, cost=cost, objective=objective(cost, plan))
    stand_ins.append(plan)
    return _term_verdict(family, best, stand_in, prefix=head + "; priced with a default layout, ")


@dataclass
class _Priced:
    config: dict
    plan: Plan
    cost: Any
    objective: float
    lower_bound: float = 0.0

    @property
    def feasible(self) -> bool:
        return self.cost.feasible


def _default_layout(config: dict) -> Plan | None:
    """A plan for a pruned configuration: wildcards become 1f1b, v=1, ZeRO 0, no recomputation."""

    def pick(key, default):
        value = config.get(key, default)
        return default if value in ("*", "", None) else value

    try:
        return Plan(
            devices=config["devices"],
            dp=config["dp"],
            tp=config["tp"],
            pp=config["pp"],
            ep=pick("ep", 1),
            expert_tp=pick("expert_tp", 1),
            cp=pick("cp", 1),
            cp_variant=pick("cp_variant", "allgather"),
            micro_batch_size=config["mbs"],
            num_microbatches=config["num_microbatches"],
            schedule=pick("schedule", "1f1b"),
            virtual_stages=pick("v", 1),
            zero_stage=pick("zero", 0),
            recompute=pick("recompute", "none"),
            sequence_parallel=bool(config.get("sp")),
            precision=config["precision"],
        )
    except (AutoplanError, KeyError, TypeError):
        return None


def families(
    candidates: list, best, *, model: CostModel | None, objective, usable: float, stand_ins: list | None = None
) -> list[FamilyVerdict]:
    """One verdict per (dp, tp, pp) family, the chosen one first, then by how close each came;
    the default-layout plans priced for pruned families are appended to ``stand_ins``."""
    stand_ins = [] if stand_ins is None else stand_ins
    grouped: dict[str, list] = {}
    for c in candidates:
        grouped.setdefault(family_of(c.config), []).append(c)
    verdicts = []
    for family, members in grouped.items():
        feasible = [c for c in members if c.feasible]
        if family == family_of(best.config):
            verdicts.append(
                FamilyVerdict(family, "chosen", f"the chosen plan ({best.plan.describe()})", best.plan.describe(), 0.0)
            )
            continue
        if feasible:
            verdict = _fitting_verdict(family, members, best, usable)
        else:
            verdict = _oom_verdict(family, members, best, usable)
        if verdict is None:
            verdict = _pruned_verdict(family, members, best, model, objective, stand_ins)
        verdicts.append(verdict)
    order = {"chosen": -1}
    return sorted(
        verdicts, key=lambda v: (order.get(v.verdict, 0), v.slower_pct if v.slower_pct is not None else float("inf"))
    )
