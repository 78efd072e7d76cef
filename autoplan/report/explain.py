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
3. **Why each rejected family lost** (autoplan/report/families.py), one verdict per (dp, tp,
   pp) family; the decision line states the nearest other family's verdict word for word.

When the model's attention is written as eager ops, one line says what SDPA/flash would save
(autoplan/report/attention.py); when it has frozen parameters, one what they save the plan
(autoplan/report/frozen.py). When the plan splits the sequence (cp > 1), one sentence says why
against the best plan without cp (:func:`cp_why`): memory per device at this sequence length, and
the exposed KV exchange against the recomputation it avoids. Under a recompute budget, one sentence
says how many blocks each stage recomputes and why (autoplan/report/recompute_budget.py); when it
offloads, one sentence says why and what the host step costs (report/offload.py); when its experts have
their own layout (ep, expert_tp), one says why against every expert on every rank (report/expert_layout.py);
when it overlaps the EP all-to-all, one what that hides and leaves (report/moe_overlap.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoplan.cost import CostModel, dollars_per_sample, reliability_fields, reliability_not_priced, usable_bytes
from autoplan.display import TERM_NAMES, duration_text
from autoplan.errors import AutoplanError
from autoplan.report.activation_offload import activation_offload_why
from autoplan.report.attention import eager_attention_saving
from autoplan.report.compression import compression_why
from autoplan.report.expert_layout import expert_layout_why
from autoplan.report.families import FamilyVerdict, Rival, families, family_of, rival_of
from autoplan.report.fp8 import fp8_gain
from autoplan.report.frozen import frozen_saving
from autoplan.report.hsdp import hsdp_why
from autoplan.report.local_sgd import local_sgd_why
from autoplan.report.moe_overlap import a2a_overlap_why
from autoplan.report.offload import offload_why
from autoplan.report.recompute_budget import recompute_why
from autoplan.report.search_again import search_again
from autoplan.report.sparse_grads import sparse_grads_why
from autoplan.report.terms import TermDiff, category_of, deciding_term
from autoplan.report.trade import trade_rows
from autoplan.report.zero_bubble import zero_bubble_why
from autoplan.solve.notes import plan_notes
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

REL_TIE = 1e-9
GIB = 2**30


@dataclass
class Explanation:
    plan: str
    family: str
    objective: str
    step_time_s: float
    peak_memory_bytes: int
    ties: list[str]
    rivals: list[Rival]
    decision: str  # the verdict of the nearest other family (families), or "no other family fits"
    decision_rival: Rival | None
    families: list[FamilyVerdict]
    thresholds: list[Any] = field(default_factory=list)  # sensitivity.Threshold
    memory: dict[str, Any] = field(default_factory=dict)
    goodput: dict[str, Any] = field(default_factory=dict)  # Prediction's checkpoint fields; {} = not priced
    goodput_note: str = ""  # why not, when not
    trade: list[dict[str, Any]] = field(default_factory=list)  # report/trade.py's rows
    warnings: list[str] = field(default_factory=list)  # solve/notes.py: little headroom, dp bound by a rule
    fp8: str = ""  # what the best FP8 plan would gain, when the search left FP8 out (report/fp8.py)
    cp: str = ""  # why the plan splits the sequence, when it does (cp_why)
    hsdp: str = ""  # why the plan replicates its ZeRO states, when it does (report/hsdp.py)
    experts: str = ""  # why the plan lays its experts out as it does, when not the default (report/expert_layout.py)
    offload: str = ""  # why the plan offloads and what that costs, when it does (report/offload.py)
    activation_offload: str = ""  # why it offloads activations, and the next option (report/activation_offload.py)
    compression: str = ""  # why it compresses gradients, and by how much that pays (report/compression.py)
    attention: str = ""  # what fusing the model's eager attention would save, when it has some (report/attention.py)
    recompute: str = ""  # why the plan recomputes k of L blocks per stage, under a budget (report/recompute_budget.py)
    frozen: str = ""  # what the model's frozen parameters save the plan, when it has some (report/frozen.py)
    zero_bubble: str = ""  # why the plan runs a zero-bubble schedule, when it does (report/zero_bubble.py)
    a2a_overlap: str = ""  # what overlapping the EP all-to-all hides and leaves, when it does (report/moe_overlap.py)
    local_sgd: str = ""  # why it syncs its replicas every H steps, and what H trades (report/local_sgd.py)
    sparse_grads: str = ""  # what syncing sparse embedding gradients saves or costs (report/sparse_grads.py)

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
        "moe_a2a_overlap",
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
    near = [rival_of(best, c) for c in others[:rivals]]
    other_family = next((c for c in others if family_of(c.config) != family_of(best.config)), None)
    return ties, near, rival_of(best, other_family) if other_family else None


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
        decision="no other family fits",
        decision_rival=other,
        families=families(result.candidates, best, model=model, objective=obj, usable=usable, stand_ins=stand_ins),
        goodput=reliability_fields(
            params=graph.param_count, devices=best.plan.devices, profile=profile, step_time_s=best.cost.step_time_s
        ),
        goodput_note=reliability_not_priced(profile) or "",
        trade=[row.to_dict() for row in trade_rows(model, best.plan, allowed=_allowed(result))],
        warnings=plan_notes(result, profile),
        fp8=fp8_gain(result, graph=graph, profile=profile),
        cp=cp_why(result, graph=graph, profile=profile, model=model),
        hsdp=hsdp_why(model, best.plan, best.cost),
        experts=expert_layout_why(model, best.plan, best.cost),
        offload=offload_why(result, graph=graph, profile=profile),
        activation_offload=activation_offload_why(result, graph=graph, profile=profile),
        compression=compression_why(result, graph=graph, profile=profile),
        attention=eager_attention_saving(model, best.plan, best.cost),
        recompute=recompute_why(model, best.plan, best.cost),
        frozen=frozen_saving(model, best.plan, best.cost),
        zero_bubble=zero_bubble_why(model, best.plan, best.cost),
        a2a_overlap=a2a_overlap_why(model, best.plan, best.cost),
        local_sgd=local_sgd_why(model, best.plan, best.cost),
        sparse_grads=sparse_grads_why(model, best.plan, best.cost),
    )
    if other is not None:  # the decision line states the verdict of the rival's family (narrate.py)
        exp.decision = exp.family_verdict(other.family).verdict
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


def cp_why(result, *, graph: Graph, profile: Profile, model: CostModel) -> str:
    """When the chosen plan splits the sequence (cp > 1), one sentence on why, against the best plan
    without cp (the same search pinned to cp = 1, as report/fp8.py asks the planner again): memory per
    device at this sequence length, and the exposed KV exchange (``Cost.cp_comm_s``) against the
    recomputation it avoids (the two plans' ``Cost.recompute_s``). '' at cp = 1."""
    from autoplan.solve.api import NoPlanFits

    best, cost = result.best, result.best_cost
    searched = best.predicted.search if best is not None and best.predicted else None
    if best is None or best.cp == 1 or searched is None:
        return ""
    head = (
        f"cp={best.cp} ({best.cp_variant}) splits each sequence of {graph.seq_len} tokens over {best.cp} ranks, "
        f"which hold {cost.peak_memory_bytes / GIB:.1f} GiB per device"
    )
    kv = f"its exposed KV exchange takes {duration_text(cost.cp_comm_s)} per step"
    try:
        flat = search_again(best, searched, graph=graph, profile=profile, pin={"cp": 1})
    except NoPlanFits as failed:
        return f"{head}; without cp {_no_fit_clause(failed)}; {kv}."
    rival, rival_cost = flat.best, flat.best_cost
    avoided_s = rival_cost.recompute_s - cost.recompute_s
    steps = f"step {duration_text(cost.step_time_s)} against {duration_text(rival_cost.step_time_s)}"
    than = "less" if cost.cp_comm_s < avoided_s else "more"
    recompute = (
        f"{than} than the {duration_text(avoided_s)} of recomputation it avoids"
        if avoided_s > 0
        else f"and it avoids no recomputation{_gain_clause(cost, rival_cost)}"
    )
    return (
        f"{head}, against {rival_cost.peak_memory_bytes / GIB:.1f} GiB for the best plan without cp "
        f"({rival.describe()}); {kv}, {recompute} ({steps})."
    )


def _gain_clause(cost, rival_cost) -> str:
    """``: it gains on <term> (X against Y)``: the term the cp = 1 plan loses most on (report/terms.py)."""
    top = deciding_term(cost, rival_cost)
    if top is None:
        return ""
    words = TERM_NAMES[top.term].words
    return f": it gains on {words}, {duration_text(top.best_s)} against {duration_text(top.rival_s)}"


def _no_fit_clause(failed) -> str:
    """What the most frugal cp = 1 plan needs, from the search that found none fits."""
    priced = [c for c in (failed.result.candidates if failed.result else []) if c.cost is not None]
    if not priced:
        return "no plan fits in device memory"
    frugal = min(priced, key=lambda c: c.cost.peak_memory_bytes)
    return (
        f"no plan fits: the most frugal ({frugal.plan.describe()}) needs "
        f"{frugal.cost.peak_memory_bytes / GIB:.1f} GiB per device"
    )


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
