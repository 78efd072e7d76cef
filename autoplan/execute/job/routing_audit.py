"""The routing a step really ran, for the execution audit: how many (token, choice) rows reached each rank's
experts, and the busiest expert-parallel rank's load over the mean (docs/cost-model.md, "The execution audit";
docs/moe.md, "Router imbalance in memory").

The cost model prices the busiest ep rank at the routing model's imbalance ``i`` (its GEMM time and its expert
activations, cost/node_terms.py ``node_terms``); the run's own is

    i_measured = max_r rows_r / mean_r rows_r      over the ranks of one pipeline stage,

``rows_r`` the rows rank ``r``'s experts received in the audited step (each experts dispatch counts them,
autoplan/execute/expert_dispatch.py). The audit reports every rank's rows against the stage's mean, and the
measured imbalance, so the plan can be priced again at it.

A rank's all-to-all bytes, expert GEMM FLOPs and peak follow its rows, so :func:`at_routing` prices each at the rows
the rank received: the balanced price plus ``(rows_r - rows) * per_row`` (cost/moe/routed_rows.py; the prediction
carries both, types/audit_prediction.py), and the audit compares the rank with that.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from autoplan.types.audit_prediction import PEAK


@contextlib.contextmanager
def counted_rows(experts: Any) -> Iterator[dict]:
    """While inside, count the rows this rank's experts receive; the dict yielded then holds ``expert_rows``
    (empty without expert parallelism)."""
    dispatches = getattr(experts, "dispatches", None) or []
    for dispatch in dispatches:
        dispatch.rows_received = 0
    found: dict = {}
    yield found
    if dispatches:
        found["expert_rows"] = sum(dispatch.rows_received for dispatch in dispatches)


def edp_by_name(experts: Any) -> dict[str, str]:
    """{the edp group's name: "edp"}: beside tp the experts' edp group may hold the same ranks as a dp group
    (dp = 2, tp = expert_tp = 2), and its ZeRO-1 messages are still the experts' (cost/volumes.py, dim edp)."""
    edp = getattr(experts, "edp_mesh", None)
    return {edp.get_group().group_name: "edp"} if edp is not None and edp.size() > 1 else {}


def measured_imbalance(ranks: list[dict]) -> dict[int, float]:
    """{stage: max over its ranks of the rows received / their mean} (module docstring), for stages whose
    experts received rows."""
    by_stage: dict[int, list[int]] = {}
    for audit in ranks:
        if "expert_rows" in audit:
            by_stage.setdefault(audit["stage"], []).append(audit["expert_rows"])
    return {stage: max(rows) * len(rows) / sum(rows) for stage, rows in by_stage.items() if sum(rows)}


def routing_rows(ranks: list[dict], row: Any) -> list[dict]:
    """One audit row per rank: the rows its experts received against its stage's mean (the balanced share),
    so the busiest rank's measured over predicted is the measured imbalance; ``row`` builds a row
    (audit.py ``_row``)."""
    means: dict[int, list[int]] = {}
    for audit in ranks:
        if "expert_rows" in audit:
            means.setdefault(audit["stage"], []).append(audit["expert_rows"])
    return [
        row(rank, audit["stage"], "expert rows received", audit["expert_rows"],
            sum(means[audit["stage"]]) / len(means[audit["stage"]]), "rows")
        for rank, audit in enumerate(ranks)
        if "expert_rows" in audit
    ]  # fmt: skip


def at_routing(pred: Any, audit: dict) -> dict[str, float]:
    """{quantity of ``ROUTED`` (types/audit_prediction.py): its price at the rows this rank's experts received}
    (module docstring), for a rank whose rows were counted and priced; empty otherwise. ``pred``: the stage's
    prediction, ``audit``: the rank's record."""
    rows = audit.get("expert_rows")
    if rows is None or not pred.expert_rows:
        return {}
    more = rows - pred.expert_rows
    return {what: _balanced(pred, what) + more * per_row for what, per_row in pred.per_expert_row.items()}


def _balanced(pred: Any, what: str) -> float:
    """``what``'s price at balanced routing: a comm row's bytes, the balanced peak, or a FLOP field."""
    if what == PEAK:
        return pred.balanced_peak_bytes
    if what.startswith("comm "):
        return pred.comm.get(tuple(what.split()[1:]), (0, 0.0))[1]
    return getattr(pred, what)
