"""What it would take to change the planner's decision, found by re-pricing with CostModel.

The *contenders* are the best plan, the next feasible candidates, and the best feasible plan
of every family, each with its layout (stages, tp_plan) held fixed.

- **Link bandwidth.** Scale every collective's bus bandwidth on one link (intra- or
  inter-node) by a factor ``f``, re-price every contender, and find where the winner changes:
  doubling/halving ``f`` up to 2^12 brackets the first change on each side of ``f = 1``, and
  bisection on ``log f`` (``BISECT_STEPS`` halvings, so the factor is known to 2^(2^-12) when
  the bracket is one doubling) locates it. Each step time is monotone in ``f``, so the first
  change is a crossing of two contenders.
- **Batch size.** The best pipelined contender (pp > 1) against the best flat one (pp = 1),
  each keeping its degrees and micro-batch size, at global batches ``B = L * j`` with ``L``
  the least common multiple of their ``dp * micro_batch_size`` (times pp for interleaved
  1F1B, which needs pp to divide the micro-batch count). Doubling/halving ``j`` brackets the
  batch at which the pipelined plan starts or stops winning; integer bisection pins it.
- **Memory.** Headroom = usable memory (capacity less the allocator headroom,
  autoplan/cost/memory/per_device.py) - the best plan's peak; the smallest device that still fits it;
  and the device memory at which the fastest plan that does not fit would fit (and win).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autoplan.cost import CostModel, usable_bytes
from autoplan.errors import AutoplanError, PlanError
from autoplan.types.graph import Graph
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

MAX_DOUBLINGS = 12
BISECT_STEPS = 12
MAX_CONTENDERS = 24
REL_TIE = 1e-9
GIB = 2**30


@dataclass
class Threshold:
    knob: str
    current: float
    unit: str
    threshold: float | None
    direction: str  # "below" | "above" | "" (no change found)
    winner: str | None
    sentence: str

    @classmethod
    def unchanged(cls, knob: str, current: float, unit: str, sentence: str, *, winner: str | None = None) -> Threshold:
        """No threshold found: the decision does not flip over the range tried (or cannot, as ``sentence`` says)."""
        return cls(knob, current, unit, None, "", winner, sentence)


def scaled_profile(profile: Profile, *, link: str, factor: float) -> Profile:
    """A copy of ``profile`` with every collective's bus bandwidth on ``link`` times ``factor``."""
    data = profile.to_dict()
    for fit in data[link]["collectives"].values():
        fit["busbw_bytes_per_s"] *= factor
    return Profile.from_dict(data)


def contenders(ranked: list, families: list, stand_ins: list[Plan] = ()) -> list[Plan]:
    """Best first, then the nearest feasible candidates, each family's best feasible one, and the
    default-layout stand-ins of families the search pruned."""
    named = {f.member for f in families if f.member}
    chosen = ranked[:MAX_CONTENDERS] + [c for c in ranked[MAX_CONTENDERS:] if c.plan.describe() in named]
    seen, plans = set(), []
    for c in chosen:
        key = c.plan.describe()
        if key not in seen:
            seen.add(key)
            plans.append(c.plan)
    return plans + [p for p in stand_ins if p.describe() not in seen]


def _winner(model: CostModel, plans: list[Plan], objective) -> int:
    """Index of the contender that wins under ``model`` (0 = the current best keeps it on ties)."""
    values = []
    for plan in plans:
        cost = model.estimate(plan)
        values.append(objective(cost, plan) if cost.feasible else math.inf)
    best = min(range(len(values)), key=lambda i: values[i])
    return 0 if values[best] >= values[0] * (1 - REL_TIE) else best


def _bisect_log(same: float, other: float, changed) -> float:
    for _ in range(BISECT_STEPS):
        mid = math.sqrt(same * other)
        same, other = (same, mid) if changed(mid) else (mid, other)
    return other


def link_thresholds(graph: Graph, profile: Profile, plans: list[Plan], objective, *, link: str) -> list[Threshold]:
    """The bandwidths of ``link``, below and above today's, at which another contender wins."""
    spec = getattr(profile, link)
    knob = f"{link.replace('_', '-')} bandwidth"
    if spec is None:
        return [
            Threshold.unchanged(knob, 0.0, "bytes/s", f"the profile has no {link.replace('_', '-')} link (one node).")
        ]
    if link == "inter_node" and not any(p.devices > profile.devices_per_node for p in plans):
        return [
            Threshold.unchanged(
                knob, 0.0, "bytes/s", "no plan here spans nodes, so the inter-node link cannot change the decision."
            )
        ]
    base = spec.collectives["all_reduce"].busbw_bytes_per_s
    cache: dict[float, int] = {}

    def winner(f: float) -> int:
        if f not in cache:
            cache[f] = _winner(CostModel(graph, scaled_profile(profile, link=link, factor=f)), plans, objective)
        return cache[f]

    found = []
    for direction, sign in (("below", -1), ("above", 1)):
        previous = 1.0
        for k in range(1, MAX_DOUBLINGS + 1):
            factor = 2.0 ** (sign * k)
            if winner(factor) != 0:
                edge = _bisect_log(previous, factor, lambda f: winner(f) != 0)
                found.append(_link_threshold(knob, base, edge, direction, plans[winner(edge)], plans[0]))
                break
            previous = factor
    if not found:
        return [
            Threshold.unchanged(
                knob,
                base,
                "bytes/s",
                f"{plans[0].describe()} stays best from 1/{2**MAX_DOUBLINGS} to {2**MAX_DOUBLINGS}x today's {knob} "
                f"({base / 1e9:.3g} GB/s all-reduce bus bandwidth).",
            )
        ]
    return found


def _link_threshold(knob: str, base: float, factor: float, direction: str, winner: Plan, best: Plan) -> Threshold:
    value = base * factor
    verb = "fell below" if direction == "below" else "rose above"
    sentence = (
        f"if the {knob} {verb} {value / 1e9:.3g} GB/s (all-reduce bus bandwidth; today {base / 1e9:.3g} GB/s, "
        f"{factor:.3g}x), {winner.describe()} would beat {best.describe()}."
    )
    return Threshold(knob, base, "bytes/s", value, direction, winner.describe(), sentence)


def _at_batch(plan: Plan, batch: int) -> Plan | None:
    per = plan.dp * plan.micro_batch_size
    if batch % per:
        return None
    m = batch // per
    if plan.schedule == "interleaved_1f1b" and m % plan.pp:
        return None
    try:
        return replace(plan, num_microbatches=m, predicted={})
    except PlanError:  # a count its schedule cannot run (a zero-bubble one's rounds: types/schedules.py)
        return None


def batch_threshold(model: CostModel, plans: list[Plan], objective) -> Threshold:
    """The global batch at which pipeline parallelism starts or stops paying (module docstring)."""
    knob, batch = "global batch size", plans[0].global_batch_size
    piped = next((p for p in plans if p.pp > 1), None)
    flat = next((p for p in plans if p.pp == 1), None)
    if piped is None or flat is None:
        what = "flat (pp = 1)" if flat is None else "pipelined (pp > 1)"
        return Threshold.unchanged(
            knob,
            batch,
            "samples",
            f"no {what} plan was among those searched and fitting (the pins or the memory left none), so the batch "
            "size cannot flip the choice between them here.",
        )
    unit = math.lcm(piped.dp * piped.micro_batch_size, flat.dp * flat.micro_batch_size)
    if piped.schedule == "interleaved_1f1b":
        unit = math.lcm(unit, piped.dp * piped.micro_batch_size * piped.pp)

    def pipe_wins(j: int) -> bool:
        values = []
        for plan in (piped, flat):
            scaled = _at_batch(plan, unit * j)
            cost = model.estimate(scaled) if scaled else None
            values.append(objective(cost, scaled) / (unit * j) if cost is not None and cost.feasible else math.inf)
        return values[0] < values[1]

    now = max(1, round(batch / unit))
    state = pipe_wins(now)
    for sign in (-1, 1):
        j_prev, j = now, now
        for _ in range(MAX_DOUBLINGS):
            j = j // 2 if sign < 0 else j * 2
            if j < 1:
                break
            if pipe_wins(j) != state:
                return _batch_sentence(
                    unit, _bisect_int(j_prev, j, lambda x: pipe_wins(x) != state), state, sign, piped, flat, batch
                )
            j_prev = j
    leader = piped if state else flat
    return Threshold.unchanged(
        knob,
        batch,
        "samples",
        winner=leader.describe(),
        sentence=f"{'pipeline parallelism keeps' if state else 'flat plans keep'} winning ({leader.describe()}) "
        f"at every global batch from {unit} to {unit * now * 2**MAX_DOUBLINGS} samples, "
        "holding each plan's micro-batch size.",
    )


def _bisect_int(same: int, other: int, changed) -> int:
    while abs(other - same) > 1:
        mid = (same + other) // 2
        same, other = (same, mid) if changed(mid) else (mid, other)
    return other


def _batch_sentence(unit: int, j: int, pipe_won: bool, sign: int, piped: Plan, flat: Plan, batch: int) -> Threshold:
    edge = unit * j
    direction = "below" if sign < 0 else "above"
    bound = "at or below" if sign < 0 else "at or above"
    if pipe_won:
        sentence = (
            f"pipeline parallelism stops paying {bound} a global batch of {edge} (today {batch}): "
            f"there {flat.describe()} beats {piped.describe()}."
        )
        winner = flat
    else:
        sentence = (
            f"pipeline parallelism would start paying {bound} a global batch of {edge} (today {batch}): "
            f"there {piped.describe()} beats {flat.describe()}."
        )
        winner = piped
    return Threshold("global batch size", batch, "samples", edge, direction, winner.describe(), sentence)


def memory_threshold(profile: Profile, ranked: list, candidates: list) -> tuple[Threshold, dict]:
    """Headroom of the best plan, and the device memory at which a faster plan would fit."""
    best = ranked[0]
    capacity = profile.device.memory_bytes
    usable = usable_bytes(capacity)
    fraction = usable / capacity
    memory = {
        "capacity_bytes": capacity,
        "usable_bytes": int(usable),
        "peak_bytes": best.cost.peak_memory_bytes,
        "headroom_bytes": int(usable - best.cost.peak_memory_bytes),
        "headroom_fraction": 1 - best.cost.peak_memory_bytes / usable,
        "smallest_device_bytes": int(math.ceil(best.cost.peak_memory_bytes / fraction)),
    }
    faster = [
        c
        for c in candidates
        if c.cost is not None and not c.cost.feasible and c.objective is not None and c.objective < best.objective
    ]
    if not faster:
        sentence = (
            "no plan that the memory limit rejected would have been faster, "
            "so more memory would not change the decision."
        )
        return Threshold.unchanged("device memory", capacity, "bytes", sentence), memory
    c = min(faster, key=lambda c: c.objective)
    need = c.cost.peak_memory_bytes / fraction
    sentence = (
        f"with devices of at least {need / GIB:.1f} GiB (today {capacity / GIB:.1f} GiB), "
        f"{c.plan.describe()} would fit and be {100 * (1 - c.objective / best.objective):.1f}% faster."
    )
    return Threshold("device memory", capacity, "bytes", need, "above", c.plan.describe(), sentence), memory


def sensitivities(
    *,
    graph: Graph,
    profile: Profile,
    ranked: list,
    candidates: list,
    objective,
    families: list,
    stand_ins: list[Plan] = (),
) -> tuple[list[Threshold], dict]:
    """Every threshold of the module docstring, and the memory numbers."""
    plans = contenders(ranked, families, stand_ins)
    found: list[Threshold] = []
    for link in ("inter_node", "intra_node"):
        try:
            found += link_thresholds(graph, profile, plans, objective, link=link)
        except AutoplanError as exc:
            found.append(Threshold.unchanged(f"{link} bandwidth", 0.0, "bytes/s", f"not computed: {exc}"))
    found.append(batch_threshold(CostModel(graph, profile), plans, objective))
    mem, memory = memory_threshold(profile, ranked, candidates)
    return found + [mem], memory
