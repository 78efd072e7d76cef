"""The step-time terms of a :class:`autoplan.types.Cost`, what kind of cost each is, and the
term-by-term difference of two plans.

The cost model's step time is the sum of ``Cost.TIME_FIELDS`` (autoplan/cost/model.py), so the
difference of two plans' step times splits exactly into per-term differences:

    step(rival) - step(best) = sum over terms t of (t(rival) - t(best))

The *deciding term* between two plans is the term with the largest positive difference: the
one the rival loses most on. Each term belongs to a category (compute, communication, bubble,
optimizer) used to say why a family of plans lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.display import TERM_NAMES
from autoplan.types.cost import Cost

#: term -> (category, words); the words are autoplan/display.py's, the one name of each term
TERMS: dict[str, tuple[str, str]] = {
    term: (category, TERM_NAMES[term].words)
    for term, category in {
        "compute_s": "compute",
        "tp_comm_s": "communication",
        "ep_comm_s": "communication",
        "cp_comm_s": "communication",
        "dp_comm_exposed_s": "communication",
        "compression_s": "compute",
        "zero_comm_s": "communication",
        "pp_comm_s": "communication",
        "bubble_s": "bubble",
        "grad_accum_s": "compute",
        "optimizer_s": "optimizer",
    }.items()
}
CATEGORIES = ("compute", "communication", "bubble", "optimizer", "out of memory")
assert set(TERMS) == set(Cost.TIME_FIELDS), "TERMS must name every Cost time field"


@dataclass(frozen=True)
class TermDiff:
    term: str
    best_s: float
    rival_s: float

    @property
    def diff_s(self) -> float:
        return self.rival_s - self.best_s

    @property
    def category(self) -> str:
        return TERMS[self.term][0]

    @property
    def words(self) -> str:
        return TERMS[self.term][1]

    @property
    def name(self) -> str:
        """The term's short name (a table header), never its field name."""
        return TERM_NAMES[self.term].header


def term_diffs(best: Cost, rival: Cost) -> list[TermDiff]:
    """Every time term of both plans, largest rival excess first."""
    diffs = [TermDiff(term, getattr(best, term), getattr(rival, term)) for term in Cost.TIME_FIELDS]
    return sorted(diffs, key=lambda d: d.diff_s, reverse=True)


def deciding_term(best: Cost, rival: Cost, *, rel_tol: float = 1e-9) -> TermDiff | None:
    """The term the rival loses most on, or None when it loses on none (a tie or a better rival)."""
    top = term_diffs(best, rival)[0]
    scale = max(best.step_time_s, rival.step_time_s, 1e-30)
    return top if top.diff_s > rel_tol * scale else None


def category_of(diff: TermDiff | None) -> str:
    return diff.category if diff is not None else "tie"
