"""``autoplan explain DIR``: why the planner chose this plan, computed from its own numbers.

Three parts, each derived from the search's priced candidates (never canned text):

1. **Why this plan.** The best plan beside its nearest rivals (the next feasible candidates
   by objective), with the term-by-term difference of their cost breakdowns
   (autoplan/report/terms.py). Plans that tie with the best are listed with what differs.
   The *decision* is named by the deciding term against the nearest rival of another
   family.
2. **What would change it** (autoplan/report/sensitivity.py): the link bandwidths and the
   batch size at which another plan wins, found by re-pricing with CostModel and bisection,
   and the memory headroom.
3. **Why each rejected family lost.** A family is one (dp, tp, pp) shape. It lost to memory
   when its members that would beat the best do not fit (or none fits); otherwise on the
   deciding term of its best feasible member. A family the search pruned by its lower bound
   is priced with the cost model's default layout (balanced stages, Megatron tp plan) to name
   the term.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoplan.cost import reliability
from autoplan.cost.memory import usable_bytes
from autoplan.cost.model import CostModel
from autoplan.cost.whole_run import dollars_per_sample
from autoplan.errors import AutoplanError
from autoplan.report.fp8 import fp8_gain
from autoplan.report.terms import TermDiff, category_of, deciding_term, term_diffs
from autoplan.report.trade import trade_rows
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

REL_TIE = 1e-9
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


@dataclass
class Explanation:
    plan: str
    family: str
    objective: str
    step_time_s: float
    peak_memory_bytes: int
    ties: list[str]
    rivals: list[Rival]
    decision: str  # category of the deciding term vs the nearest other family
    decision_rival: Rival | None
    families: list[FamilyVerdict]
    thresholds: list[Any] = field(default_factory=list)  # sensitivity.Threshold
    memory: dict[str, Any] = field(default_factory=dict)
    goodput: dict[str, Any] = field(default_factory=dict)  # Prediction's checkpoint fields; {} = not priced
    goodput_note: str = ""  # why not, when not
    trade: list[dict[str, Any]] = field(default_factory=list)  # report/trade.py's rows
    fp8: str = ""  # what the best FP8 plan would gain, when the search left FP8 out (report/fp8.py)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for rival in [data["decision_rival"], *data["rivals"]]:
            if rival is not None:
                rival["category"] = category_of(TermDiff(**rival["deciding"]) if rival["deciding"] else None)
        return data

    def family_verdict(self, family: str) -> FamilyVerdict:
        return next(f for f in self.families if f.family == family)

    def to_markdown(self) -> str:
        from autoplan.report.narrate import explanation_markdown

        return explanation_markdown(self)


def family_of(config: dict) -> str:
    ep = config.get("ep", 1)
    ep = f" ep={ep}" if str(ep) not in ("1", "nan", "") else ""
    return f"dp={config['dp']}{ep} tp={config['tp']} pp={config['pp']}"


def _rival(best, cand) -> Rival:
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


def _differs(best: Plan, other: Plan) -> str:
    keys = (
        "micro_batch_size",
        "num_microbatches",
        "schedule",
        "virtual_stages",
        "zero_stage",
        "recompute",
        "sequence_parallel",
        "precision",
    )
    return ", ".join(f"{k}={getattr(other, k)}" for k in keys if getattr(other, k) != getattr(best, k)) or "layout only"


def why_this_plan(ranked: list, *, rivals: int) -> tuple[list[str], list[Rival], Rival | None]:
    """Ties with the best, the nearest ``rivals`` others, and the nearest rival of another family."""
    best = ranked[0]
    tie_limit = best.objective * (1 + REL_TIE)
    ties = [
        f"{c.plan.describe()} (differs in {_differs(best.plan, c.plan)}; peak memory "
        f"{(c.cost.peak_memory_bytes - best.cost.peak_memory_bytes) / GIB:+.2f} GiB)"
        for c in ranked[1:]
        if c.objective <= tie_limit
    ]
    others = [c for c in ranked[1:] if c.objective > tie_limit]
    near = [_rival(best, c) for c in others[:rivals]]
    other_family = next((c for c in others if family_of(c.config) != family_of(best.config)), None)
    return ties, near, _rival(best, other_family) if other_family else None


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _oom_verdict(family: str, members: list, best, usable: float) -> FamilyVerdict | None:
    priced = [c for c in members if c.cost is not None]
    faster = [c for c in priced if not c.cost.feasible and c.objective < best.objective]
    if faster:
        c = min(faster, key=lambda c: c.objective)
        detail = (
            f"its fastest member ({c.plan.describe()}) would be {100 * (1 - c.objective / best.objective):.1f}% faster "
            f"but needs {_gib(c.cost.peak_memory_bytes)} per device of {_gib(usable)} usable"
        )
        return FamilyVerdict(
            family, "out of memory", detail, c.plan.describe(), 100 * (c.objective / best.objective - 1)
        )
    if priced and not any(c.feasible for c in priced):
        c = min(priced, key=lambda c: c.cost.peak_memory_bytes)
        detail = (
            f"none of its {len(priced)} priced members fits: the most frugal ({c.plan.describe()}) "
            f"needs {_gib(c.cost.peak_memory_bytes)} of {_gib(usable)} usable"
        )
        return FamilyVerdict(family, "out of memory", detail, c.plan.describe())
    return None


def _term_verdict(family: str, best, cand, *, prefix: str = "") -> FamilyVerdict:
    rival = _rival(best, cand)
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
        f"({d.rival_s * 1e3:.3g} ms vs {d.best_s * 1e3:.3g} ms)"
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
        verdict = _oom_verdict(family, members, best, usable)
        if verdict is None and feasible:
            verdict = _term_verdict(family, best, min(feasible, key=lambda c: c.objective))
        if verdict is None:
            verdict = _pruned_verdict(family, members, best, model, objective, stand_ins)
        verdicts.append(verdict)
    order = {"chosen": -1}
    return sorted(
        verdicts, key=lambda v: (order.get(v.verdict, 0), v.slower_pct if v.slower_pct is not None else float("inf"))
    )


def objective_fn(name: str, profile: Profile, batch_size: int):
    """The planner's objective (solve/search.py): step time, or dollars per sample."""
    if name == "cost":
        return lambda cost, plan: dollars_per_sample(
            profile, devices=plan.devices, step_time_s=cost.step_time_s, batch_size=batch_size
        )
    return lambda cost, plan: cost.step_time_s


def explain_result(
    result, *, graph: Graph, profile: Profile, objective: str = "time", rivals: int = 3, sensitivity: bool = True
) -> Explanation:
    """Explain a planner SearchResult (autoplan/solve/search.py) for ``graph`` on ``profile``."""
    ranked = result.ranked()
    if not ranked:
        raise AutoplanError(
            "no plan fits, so there is no decision to explain; "
            "see plans.csv's reason column for what each candidate needs."
        )
    best = ranked[0]
    batch = best.plan.global_batch_size
    obj = objective_fn(objective, profile, batch)
    model = CostModel(graph, profile)
    usable = usable_bytes(profile.device.memory_bytes)
    ties, near, other = why_this_plan(ranked, rivals=rivals)
    stand_ins: list[Plan] = []
    exp = Explanation(
        plan=best.plan.describe(),
        family=family_of(best.config),
        objective=objective,
        step_time_s=best.cost.step_time_s,
        peak_memory_bytes=best.cost.peak_memory_bytes,
        ties=ties,
        rivals=near,
        decision=other.category if other else "no other family fits",
        decision_rival=other,
        families=families(result.candidates, best, model=model, objective=obj, usable=usable, stand_ins=stand_ins),
        goodput=reliability.prediction_fields(
            params=graph.param_count, devices=best.plan.devices, profile=profile, step_time_s=best.cost.step_time_s
        ),
        goodput_note=reliability.not_priced_reason(profile) or "",
        trade=[row.to_dict() for row in trade_rows(model, best.plan, allowed=_allowed(result))],
        fp8=fp8_gain(result, graph=graph, profile=profile),
    )
    if sensitivity:
        from autoplan.report.sensitivity import sensitivities

        exp.thresholds, exp.memory = sensitivities(
            graph=graph,
            profile=profile,
            ranked=ranked,
            candidates=result.candidates,
            objective=obj,
            families=exp.families,
            stand_ins=stand_ins,
        )
    return exp


def _allowed(result) -> set[str]:
    """What the search that chose the plan could pick (its saved summary): "lossy", "fp8"."""
    predicted = result.best.predicted if result.best is not None else None
    searched = predicted.search if predicted else None
    if searched is None:
        return set()
    fp8 = searched.allow_fp8 or searched.fixes.get("precision") == "fp8"
    return {name for name, on in (("lossy", searched.allow_lossy), ("fp8", fp8)) if on}


def explain(
    source,
    *,
    graph: Graph | None = None,
    profile: Profile | None = None,
    objective: str | None = None,
    rivals: int = 3,
    sensitivity: bool = True,
) -> Explanation:
    """Explain a plan folder (``autoplan plan --out DIR``) or a SearchResult (with its graph and profile)."""
    if isinstance(source, (str, Path)):
        from autoplan.report.folder import load_plan_folder, search_again

        folder = load_plan_folder(source)
        result = search_again(folder)
        graph, profile = folder.graph, folder.profile
        objective = objective or folder.search_options["objective"]
    else:
        result = source
        if graph is None or profile is None:
            raise AutoplanError(
                "explain(result) needs the graph and the profile the search ran on; pass graph= and profile=."
            )
    return explain_result(
        result, graph=graph, profile=profile, objective=objective or "time", rivals=rivals, sensitivity=sensitivity
    )
