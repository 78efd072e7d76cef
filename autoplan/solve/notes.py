"""One-line warnings about the chosen plan, from the search's own record (``autoplan plan`` and
``autoplan explain`` print them):

- **Little memory headroom.** The audit finds the priced peak 0-12% from the measured one
  (docs/cost-model.md, "The execution audit"), so a plan that leaves less than
  ``LOW_HEADROOM_FRACTION`` of the usable memory spare may not fit when it runs. The line names the
  fastest plan the search priced that leaves that much, as the ``--fix`` pin that picks it, and
  what it costs in step time; with none, the pins that save memory.
- **dp bound by a rule.** When every larger data-parallel degree on these devices was refused
  by a rule of the space (solve/space.py: the batch does not divide by dp, a pin) or none of its
  priced plans fits in memory, the line says which, and for the batch rule the batches that would
  allow more (``--devices 64 --batch 100`` can only use dp in {1, 2, 4}: 100 = 2^2 x 5^2). A
  larger dp that was searched and only lost on speed gets no line: ``autoplan explain`` says why.
- **A pinned tp that splits nothing.** The search prunes a tp > 1 whose ILP replicates every op, unless tp is
  pinned; then the line says the tp ranks repeat the same work (the ILP found splitting slower, or the layers are
  no modules autoplan shards, such as a linear written as ``x @ self.weight.T``).
"""

from __future__ import annotations

import math

from autoplan.cost import usable_bytes
from autoplan.display import number_text
from autoplan.solve.candidates import SearchResult, config_of, splits_nothing
from autoplan.types.plan import Plan
from autoplan.types.profile import Profile

LOW_HEADROOM_FRACTION = 0.05
GIB = 2**30
#: Plan fields a --fix pins (solve/pins.FIX_KEYS), as config_of names them, and how a pin spells them
PIN_KEYS = ("dp", "ep", "tp", "pp", "mbs", "zero", "recompute", "schedule", "v", "sp", "tp_overlap", "precision")


def plan_notes(result: SearchResult, profile: Profile) -> list[str]:
    """Every warning that applies to ``result``'s best plan (module docstring)."""
    return [note for note in (headroom_note(result, profile), dp_note(result), tp_note(result)) if note]


def headroom_fraction(peak_bytes: float, profile: Profile) -> float:
    return 1.0 - peak_bytes / usable_bytes(profile.device.memory_bytes)


def headroom_note(result: SearchResult, profile: Profile) -> str | None:
    ranked = result.ranked()
    if not ranked or (spare := headroom_fraction(ranked[0].cost.peak_memory_bytes, profile)) >= LOW_HEADROOM_FRACTION:
        return None
    best = ranked[0]
    usable = usable_bytes(profile.device.memory_bytes)
    left_gib = (usable - best.cost.peak_memory_bytes) / GIB
    head = (
        f"the plan leaves {spare:.1%} of usable memory spare ({number_text(left_gib)} "
        f"of {number_text(usable / GIB)} GiB), less than the {LOW_HEADROOM_FRACTION:.0%} the cost model's memory "
        "error needs"
    )
    roomy = next(
        (c for c in ranked[1:] if headroom_fraction(c.cost.peak_memory_bytes, profile) >= LOW_HEADROOM_FRACTION), None
    )
    if roomy is None:
        saving = _saving_pins(best.plan)
        return head + (f"; no plan priced leaves more: try {' or '.join(saving)}." if saving else ".")
    slower = 100 * (roomy.cost.step_time_s / best.cost.step_time_s - 1)
    spare_then = headroom_fraction(roomy.cost.peak_memory_bytes, profile)
    return head + (
        f"; the fastest priced plan with that much spare is {slower:.1f}% slower ({spare_then:.0%} spare): "
        f"--fix {pin_of(best.plan, roomy, ranked)}."
    )


def _saving_pins(plan: Plan) -> list[str]:
    pins = [] if plan.recompute == "full" else ["--fix recompute=full"]
    return pins + ([] if plan.zero_stage == 3 or plan.dp == 1 else ["--fix zero=3"])


def pin_of(best: Plan, target, ranked: list) -> str:
    """The --fix value that makes the search pick ``target`` (a ranked candidate) over ``best``:
    what it changes, or all of its fields when a faster ranked plan shares those changes."""
    mine, theirs = config_of(best), target.config
    changed = [key for key in PIN_KEYS if theirs[key] != mine[key]]
    first = next(c for c in ranked if all(c.config[key] == theirs[key] for key in changed))
    keys = changed if first is target else PIN_KEYS
    return ",".join(_pin(key, theirs[key]) for key in keys)


def _pin(key: str, value) -> str:
    """One ``--fix`` pair; a budgeted recompute ("full:2/1", config_of) pins its mode and its budget."""
    mode, _, budget = str(value).partition(":") if key == "recompute" else ("", "", "")
    return f"recompute={mode},recompute_blocks={budget}" if budget else f"{key}={_spelt(value)}"


def _spelt(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def tp_note(result: SearchResult) -> str | None:
    """A pinned tp > 1 whose plan splits no op (module docstring)."""
    ranked = result.ranked()
    best = ranked[0].plan if ranked else None
    if best is None or best.tp == 1 or not splits_nothing(best.tp_plan):
        return None
    return (
        f"tp={best.tp} splits no op of this model: the plan replicates every layer (splitting them is slower, or they "
        "are no modules autoplan shards, such as a linear written as x @ self.weight.T), so its "
        f"{best.tp} tensor-parallel ranks repeat the same work; unpin tp to use those devices for data parallelism."
    )


def dp_note(result: SearchResult) -> str | None:
    """Why dp is not larger, when a rule or memory (not speed) bound it (module docstring)."""
    ranked = result.ranked()
    if not ranked:
        return None
    best = ranked[0].plan
    members = _members_by_dp(result, best.devices)
    larger = _larger_dps(result, best, members)
    if not larger:
        return None
    why = {dp: _bound(result, best.devices, dp, members.get(dp, [])) for dp in larger}
    if not all(why.values()):
        return None  # some larger dp was searched and lost on speed: explain's family verdicts
    parts = [_sentence(rule, [dp for dp in larger if why[dp] == rule], best) for rule in dict.fromkeys(why.values())]
    return f"dp is {best.dp}, not more: " + "; ".join(parts) + "."


def _members_by_dp(result: SearchResult, devices: int) -> dict[int, list]:
    """The candidates on ``devices`` devices by their dp, in the search's order: one pass over the candidates
    (a pass per larger dp took 25 ms of GPT-1T's 74K)."""
    found: dict[int, list] = {}
    for c in result.candidates:
        if c.config["devices"] == devices:
            found.setdefault(c.config["dp"], []).append(c)
    return found


def _larger_dps(result: SearchResult, best: Plan, members: dict[int, list]) -> list[int]:
    """The dps above ``best``'s on its devices that a rule refused or the search reached (``members``)."""
    refused = {r.dp for r in result.refused if r.devices == best.devices and r.dp > best.dp}
    return sorted(refused | {dp for dp in members if dp > best.dp})


def _bound(result: SearchResult, devices: int, dp: int, members: list) -> str:
    """The rule that refused every shape with this dp (``members``: its candidates); ``memory`` or ``run`` (its
    deadline or budget) when none of its plans fits for that reason; "" when one fits or was pruned by its
    bound (it lost on speed)."""
    if members:
        kinds = {_kind(c) for c in members}
        return "" if "speed" in kinds else ("run" if "run" in kinds else "memory")
    rules = {r.rule for r in result.refused if r.devices == devices and r.dp == dp}
    return next((rule for rule in sorted(rules) if rule in ("batch", "whole batch") or rule.startswith("pin")), "")


def _kind(c) -> str:
    """What kept a candidate from winning: ``speed``, ``run`` or ``memory`` (solve/search.py's reasons)."""
    if c.feasible:
        return "speed"
    if c.misses or c.reason.startswith("pruned: even at its lower bound the run"):
        return "run"
    if c.cost is None and not c.reason.startswith("pruned (memory)"):
        return "speed"  # pruned by its lower bound
    return "memory"


def _sentence(rule: str, dps: list[int], best: Plan) -> str:
    batch = best.global_batch_size
    listed = "dp=" + (f"{', '.join(map(str, dps[:-1]))} or {dps[-1]}" if len(dps) > 1 else str(dps[0]))
    if rule == "batch":
        one = math.ceil(batch / dps[0]) * dps[0]
        every = math.lcm(*dps)
        every = math.ceil(batch / every) * every
        more = f"a batch of {one} allows dp={dps[0]}" + (f", {every} every dp up to {dps[-1]}" if len(dps) > 1 else "")
        return f"the batch of {batch} ({_factors(batch)}) does not divide by {listed}; {more}"
    if rule == "whole batch":
        return (
            "the model's output couples the samples of a batch (an in-batch contrastive loss), which data "
            "parallelism and micro-batches would split into another loss, so the batch stays whole; gather the "
            "embeddings across ranks in the model's loss to train it data-parallel"
        )
    if rule == "memory":
        return f"no plan with {listed} fits in memory"
    if rule == "run":
        return f"no plan with {listed} meets the run's deadline or budget"
    key = rule.removeprefix("pin ")
    return f"--fix {key}={getattr(best, key)} refuses {listed}"


def _factors(n: int) -> str:
    """``100`` -> ``2^2 x 5^2``."""
    found, p = [], 2
    while p * p <= n:
        k = 0
        while n % p == 0:
            n, k = n // p, k + 1
        found += [f"{p}^{k}" if k > 1 else str(p)] if k else []
        p += 1
    return " x ".join(found + ([str(n)] if n > 1 else [])) or "1"
